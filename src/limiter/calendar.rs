//! Calendar windows: a budget per calendar day, ISO week (Monday to Sunday) or month, in UTC or
//! an IANA time zone, that comes back whole at the boundary (midnight, Monday's midnight, the
//! 1st's midnight, local time) rather than a window after a key's first request.
//!
//! A calendar window is a fixed window whose end is the next boundary: [`Calendar::next_boundary`]
//! is all the counting needs, so both stores, `check`, `simulate` and `replay` count it with the
//! fixed window's code. Times are nanoseconds since the Unix epoch (the system clock's time line
//! is anchored to it; a virtual clock's is taken as such).
//!
//! A day in a time zone that changes its offset is 23 or 25 hours long; a boundary that falls
//! in a gap (a zone whose clocks jump over midnight) is the first instant after it.

use crate::clock::Nanos;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    Day,
    /// ISO week: Monday 00:00 to the next Monday 00:00.
    Week,
    Month,
}

impl CalendarUnit {
    /// `day`, `week` or `month` (as the configuration writes them).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "day" => Some(Self::Day),
            "week" => Some(Self::Week),
            "month" => Some(Self::Month),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
        }
    }

    /// The longest such period (a month of 31 days and an hour, a day of 25 hours): what a key
    /// may wait at most, the figure `check` judges with.
    pub fn longest(self) -> Duration {
        Duration::from_secs(match self {
            Self::Day => 25 * 3600,
            Self::Week => 7 * 86_400 + 3600,
            Self::Month => 31 * 86_400 + 3600,
        })
    }
}

/// A time zone by its IANA name, loaded once per process and kept for it: a configuration names
/// at most the few hundred zones the database holds, and a reload that names the same zone
/// finds it again rather than loading it twice.
#[derive(Debug)]
pub struct Zone {
    name: Box<str>,
    tz: TimeZone,
}

impl Zone {
    /// UTC.
    pub fn utc() -> &'static Zone {
        static UTC: OnceLock<Zone> = OnceLock::new();
        UTC.get_or_init(|| Zone {
            name: "UTC".into(),
            tz: TimeZone::UTC,
        })
    }

    /// The zone an IANA name names (`Europe/Berlin`, `UTC`; case as the database spells it or
    /// not), or why not.
    pub fn named(name: &str) -> Result<&'static Zone, String> {
        let name = name.trim();
        if name.eq_ignore_ascii_case("utc") || name.eq_ignore_ascii_case("etc/utc") {
            return Ok(Self::utc());
        }
        // A name the database lacks is refused before anything is kept for it.
        if name.is_empty() || name.len() > 64 {
            return Err(format!("`{name}` is not a time zone; use an IANA name such as \"UTC\" or \"Europe/Berlin\""));
        }
        let tz = TimeZone::get(name).map_err(|_| {
            format!("`{name}` is not a time zone of the IANA database; use a name such as \"UTC\", \"Europe/Berlin\" or \"America/New_York\"")
        })?;
        let canonical = tz.iana_name().unwrap_or(name).to_owned();
        static ZONES: OnceLock<Mutex<Vec<&'static Zone>>> = OnceLock::new();
        let mut zones = ZONES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(z) = zones.iter().find(|z| *z.name == canonical) {
            return Ok(z);
        }
        let zone: &'static Zone = Box::leak(Box::new(Zone {
            name: canonical.into_boxed_str(),
            tz,
        }));
        zones.push(zone);
        Ok(zone)
    }

    /// The IANA name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A calendar window: a unit in a zone.
#[derive(Debug, Clone, Copy)]
pub struct Calendar {
    pub unit: CalendarUnit,
    pub zone: &'static Zone,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit && std::ptr::eq(self.zone, other.zone)
    }
}

impl Eq for Calendar {}

impl Calendar {
    pub fn new(unit: CalendarUnit, zone: &'static Zone) -> Self {
        Self { unit, zone }
    }

    /// A calendar window in UTC.
    pub fn utc(unit: CalendarUnit) -> Self {
        Self::new(unit, Zone::utc())
    }

    /// `day`, or `day in Europe/Berlin`: how reports and `check` name it.
    pub fn describe(&self) -> String {
        if std::ptr::eq(self.zone, Zone::utc()) {
            format!("calendar {} (UTC)", self.unit.as_str())
        } else {
            format!("calendar {} ({})", self.unit.as_str(), self.zone.name)
        }
    }

    /// The instant (ns since the Unix epoch) the period holding `now` ends: the next midnight,
    /// Monday's midnight or the 1st's midnight, local time.
    pub fn next_boundary(&self, now: Nanos) -> Nanos {
        let (_, end) = self.period(now);
        end
    }

    /// The period holding `now`: its start and its end, in ns since the Unix epoch.
    pub fn period(&self, now: Nanos) -> (Nanos, Nanos) {
        let tz = &self.zone.tz;
        let Ok(ts) = Timestamp::from_nanosecond(i128::from(now)) else {
            return (
                now,
                now.saturating_add(self.unit.longest().as_nanos() as Nanos),
            );
        };
        let today = tz.to_datetime(ts).date();
        let (start, end) = match self.unit {
            CalendarUnit::Day => (Some(today), today.tomorrow().ok()),
            CalendarUnit::Week => {
                let back = i64::from(today.weekday().to_monday_zero_offset());
                let monday = shift_days(today, -back);
                (monday, monday.and_then(|m| shift_days(m, 7)))
            }
            CalendarUnit::Month => {
                let first = today.first_of_month();
                let next = if first.month() == 12 {
                    Date::new(first.year().saturating_add(1), 1, 1).ok()
                } else {
                    Date::new(first.year(), first.month() + 1, 1).ok()
                };
                (Some(first), next)
            }
        };
        let at = |d: Option<Date>| -> Option<Nanos> {
            let ns = d?
                .to_zoned_datetime(tz.clone())
                .ok()?
                .timestamp()
                .as_nanosecond();
            Nanos::try_from(ns).ok()
        };
        let start = at(start).unwrap_or(now).min(now);
        let end = at(end)
            .filter(|e| *e > now)
            .unwrap_or_else(|| now.saturating_add(self.unit.longest().as_nanos() as Nanos));
        (start, end)
    }
}

/// `d` moved by `n` days.
fn shift_days(d: Date, n: i64) -> Option<Date> {
    let z = crate::calendar::days_from_civil(
        i64::from(d.year()),
        i64::from(d.month()),
        i64::from(d.day()),
    ) + n;
    let (y, m, dd) = crate::calendar::civil_from_days(z);
    Date::new(
        i16::try_from(y).ok()?,
        i8::try_from(m).ok()?,
        i8::try_from(dd).ok()?,
    )
    .ok()
}

#[cfg(test)]
mod tests;
