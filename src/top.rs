//! Top talkers: per limiter, the principals refused most and the ones that asked most, over the
//! last 1, 5 and 15 minutes.
//!
//! Each limiter's buckets are split by digest into [`STRIPES`] stripes, each under its own
//! lock, so workers counting different buckets at once do not wait on (or bounce the cache
//! lines of) one lock. Each stripe keeps a ring of [`MINUTES`] one-minute slots; each slot holds
//! two space-saving sketches (Metwally, Agrawal and El Abbadi, 2005) of at most
//! [`STRIPE_CAPACITY`] buckets: one counting requests, one counting refusals. A sketch counts
//! exactly until it is full; from then on a new bucket takes the place of the smallest,
//! inheriting its count as its possible error, so a count is never under the truth and over it
//! by at most its `error`. Any bucket with more than its stripe's total for the minute over
//! [`STRIPE_CAPACITY`] is always in it: with traffic spread over the stripes, a minute's total
//! over [`CAPACITY`]. A bucket is only ever in its own stripe, so stripes merge by putting their
//! rows side by side. Merged over minutes (and instances), a row's `error` also adds, for each
//! slot (or instance) that does not hold it, that sketch's smallest count when it was full: the
//! truth is within `error` of `count`, and `error` is 0 while no sketch overflowed.
//!
//! Memory is bounded whatever the traffic: limiters × [`MINUTES`] × 2 × [`CAPACITY`] rows, each
//! the bucket's 16-byte digest and a label under [`MAX_LABEL`] bytes (about 26 MB for 20
//! limiters at the worst). A label says who it is without a secret: the address (an IPv6 /56),
//! a user's subject, a proxy-set header's value; an agent id, a token, a client's key header or
//! a body's value is never kept, only named by the bucket's digest (`agent #1f2e3d4c5b6a at
//! 203.0.113.7`). What is kept per bucket is a [`Seed`], made into the label when asked.

use crate::keys::{BucketKey, Seed};
use crate::store::{SharedTable, StoreError};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// One-minute slots each limiter keeps: the longest window asked about.
pub(crate) const MINUTES: usize = 15;
/// Stripes each limiter's lists are split into, by bucket digest.
pub(crate) const STRIPES: usize = 8;
/// Buckets each stripe's sketch holds.
pub(crate) const STRIPE_CAPACITY: usize = 32;
/// Buckets one list holds per minute, every stripe together.
pub(crate) const CAPACITY: usize = STRIPES * STRIPE_CAPACITY;
/// The longest label kept (longer ones are cut).
pub(crate) const MAX_LABEL: usize = 160;
/// Rows a query answers at most per list.
pub(crate) const MAX_ROWS: usize = 100;
/// The windows a query may ask for, in minutes.
pub(crate) const WINDOWS: [u64; 3] = [1, 5, 15];

const MINUTE_NS: u64 = 60_000_000_000;

/// Who a bucket belongs to, as an operator reads it; what a row offers to act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Label {
    /// `203.0.113.7`, `agent #1f2e3d4c5b6a at 203.0.113.7`, `user alice`.
    pub principal: String,
    /// The address (or IPv6 /56) the bucket is keyed on, when it is keyed on one: a reset or
    /// an override (`ip:<address>`) can name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

impl Label {
    /// A label, cut to [`MAX_LABEL`] bytes on a character boundary.
    pub(crate) fn new(principal: String, address: Option<String>) -> Self {
        let cut = |mut s: String| {
            if s.len() > MAX_LABEL {
                let mut at = MAX_LABEL;
                while !s.is_char_boundary(at) {
                    at -= 1;
                }
                s.truncate(at);
            }
            s
        };
        Self {
            principal: cut(shown(&principal).into_owned()),
            address: address.map(|a| cut(shown(&a).into_owned())),
        }
    }
}

/// Whether `c` would change how a line around it reads without being seen itself: a
/// bidirectional control (U+202A–U+202E embeddings and overrides, U+2066–U+2069 isolates,
/// U+200E/U+200F marks, U+061C), a zero-width character (U+200B–U+200D, U+2060, U+FEFF), or a
/// control character (a terminal's escape sequences among them).
pub(crate) fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{061c}'
            | '\u{200b}'..='\u{200d}'
            | '\u{2060}'
            | '\u{feff}'
    ) || c.is_control()
}

/// `s` with every [`invisible`] character written as its escape (`\u{202e}`), as `top` and the
/// `/top` page show a label: a principal cannot reorder or hide the operator's line.
pub(crate) fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(invisible) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if invisible(c) {
            use std::fmt::Write as _;
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[derive(Debug, Clone)]
struct Counted {
    count: u64,
    error: u64,
    seed: Seed,
}

/// A space-saving sketch of at most [`STRIPE_CAPACITY`] buckets.
#[derive(Debug, Default)]
struct Sketch {
    rows: HashMap<BucketKey, Counted, foldhash::fast::RandomState>,
    /// The smallest count evicted so far (0: nothing was evicted; the sketch is exact).
    floor: u64,
    /// Buckets that held the smallest count when last looked for, the next to give way: the
    /// smallest count never goes down, so one scan finds every bucket at it, and a flood of new
    /// buckets costs one scan per [`STRIPE_CAPACITY`] arrivals rather than one each.
    smallest: Vec<BucketKey>,
    /// The count the buckets of `smallest` held.
    smallest_count: u64,
}

impl Sketch {
    /// Count one for `key`; `true` when another bucket gave way for it.
    fn add(&mut self, key: &BucketKey, seed: &mut dyn FnMut() -> Seed) -> bool {
        if let Some(c) = self.rows.get_mut(key) {
            c.count += 1;
            return false;
        }
        if self.rows.len() < STRIPE_CAPACITY {
            self.rows.insert(
                key.clone(),
                Counted {
                    count: 1,
                    error: 0,
                    seed: seed(),
                },
            );
            return false;
        }
        // Full: the smallest gives way, and the newcomer may have had as many uncounted.
        let Some((smallest, min)) = self.take_smallest() else {
            return false;
        };
        self.rows.remove(&smallest);
        self.floor = self.floor.max(min);
        self.rows.insert(
            key.clone(),
            Counted {
                count: min + 1,
                error: min,
                seed: seed(),
            },
        );
        true
    }

    /// A bucket holding the smallest count, and that count.
    fn take_smallest(&mut self) -> Option<(BucketKey, u64)> {
        // A bucket counted since it was found no longer holds the smallest count: skip it.
        while let Some(k) = self.smallest.pop() {
            if self
                .rows
                .get(&k)
                .is_some_and(|c| c.count == self.smallest_count)
            {
                return Some((k, self.smallest_count));
            }
        }
        let min = self.rows.values().map(|c| c.count).min()?;
        self.smallest = self
            .rows
            .iter()
            .filter(|(_, c)| c.count == min)
            .map(|(k, _)| k.clone())
            .collect();
        self.smallest_count = min;
        self.smallest.pop().map(|k| (k, min))
    }

    /// What a bucket the sketch does not hold may have had uncounted: its smallest count once
    /// it has evicted, else 0.
    fn absent_bound(&self) -> u64 {
        if self.floor == 0 {
            0
        } else {
            self.rows.values().map(|c| c.count).min().unwrap_or(0)
        }
    }

    fn clear(&mut self) {
        self.rows.clear();
        self.floor = 0;
        self.smallest.clear();
        self.smallest_count = 0;
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// Minutes since the epoch this slot counts (`u64::MAX`: none yet).
    minute: u64,
    requests: Sketch,
    refusals: Sketch,
}

/// One stripe's ring of minutes, alone on its cache lines: the lock two workers take for
/// buckets of different stripes is never on one line.
#[derive(Debug)]
#[repr(align(128))]
struct Stripe(Mutex<Vec<Slot>>);

impl Stripe {
    fn new() -> Self {
        Self(Mutex::new(
            (0..MINUTES)
                .map(|_| Slot {
                    minute: u64::MAX,
                    ..Slot::default()
                })
                .collect(),
        ))
    }
}

/// One limiter's lists: its stripes.
#[derive(Debug)]
struct Ring {
    stripes: [Stripe; STRIPES],
    /// Buckets its sketches let go to make room.
    evictions: std::sync::atomic::AtomicU64,
}

impl Ring {
    fn new() -> Self {
        Self {
            stripes: std::array::from_fn(|_| Stripe::new()),
            evictions: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The stripe `key` is counted in.
    fn stripe(&self, key: &BucketKey) -> &Stripe {
        &self.stripes[usize::from(key.digest[15]) % STRIPES]
    }
}

type Rings = HashMap<Arc<str>, Arc<Ring>, foldhash::fast::RandomState>;

/// The top talkers of every limiter.
#[derive(Debug)]
pub(crate) struct TopTalkers {
    /// Read without a lock on every request (a snapshot); replaced whole, under `adding`, when
    /// a limiter is first counted.
    limiters: ArcSwap<Rings>,
    adding: Mutex<()>,
    /// This process's name in the shared table: random, never reused.
    instance: String,
}

impl Default for TopTalkers {
    fn default() -> Self {
        Self {
            limiters: ArcSwap::from_pointee(Rings::default()),
            adding: Mutex::new(()),
            instance: format!("{:016x}", rand::random::<u64>()),
        }
    }
}

/// One row of a list: a bucket, who it is, and its count within `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Row {
    /// The bucket's stored name, `<limiter>:<hex digest>`: the same on every instance of one
    /// Redis store.
    pub bucket: String,
    #[serde(flatten)]
    pub label: Label,
    pub count: u64,
    /// The count is within this of the truth (0: exact).
    pub error: u64,
}

/// One limiter's lists over one window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LimiterTop {
    pub limiter: String,
    /// Refusals in the window, every limiter's own and the requests of every other limiter's
    /// principals it refused.
    pub refused: Vec<Row>,
    pub requests: Vec<Row>,
    /// What a bucket missing from `refused` or `requests` may have had uncounted.
    pub refused_absent_bound: u64,
    pub requests_absent_bound: u64,
}

impl TopTalkers {
    /// Count one request of `key` on `limiter` at `now` (ns since the Unix epoch), and a refusal
    /// when `refused`. `seed` runs only for a bucket new to a sketch.
    pub(crate) fn record(
        &self,
        limiter: &Arc<str>,
        key: &BucketKey,
        refused: bool,
        now: u64,
        seed: impl FnOnce() -> Seed,
    ) {
        // Borrowed from the snapshot, not cloned: a clone would write the ring's shared count
        // on every request, from every worker.
        let rings = self.limiters.load();
        let added;
        let ring = match rings.get(limiter) {
            Some(r) => r,
            None => {
                added = self.ring(limiter);
                &added
            }
        };
        let minute = now / MINUTE_NS;
        let mut slots = ring.stripe(key).0.lock();
        let Some(slot) = slots.get_mut((minute % MINUTES as u64) as usize) else {
            return;
        };
        if slot.minute != minute {
            slot.minute = minute;
            slot.requests.clear();
            slot.refusals.clear();
        }
        let mut seed = Some(seed);
        let mut made: Option<Seed> = None;
        let mut get = || {
            if let Some(s) = &made {
                return s.clone();
            }
            let s = seed
                .take()
                .map_or_else(|| Seed::Text(Arc::from(""), None), |f| f());
            made = Some(s.clone());
            s
        };
        let mut evicted = u64::from(slot.requests.add(key, &mut get));
        if refused {
            evicted += u64::from(slot.refusals.add(key, &mut get));
        }
        if evicted > 0 {
            ring.evictions
                .fetch_add(evicted, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Per limiter: the buckets its lists hold now, and how many they let go so far.
    pub(crate) fn counts(&self) -> Vec<(Arc<str>, u64, u64)> {
        let mut out: Vec<(Arc<str>, u64, u64)> = self
            .limiters
            .load()
            .iter()
            .map(|(name, ring)| {
                let rows = ring
                    .stripes
                    .iter()
                    .map(|stripe| {
                        stripe
                            .0
                            .lock()
                            .iter()
                            .map(|s| (s.requests.rows.len() + s.refusals.rows.len()) as u64)
                            .sum::<u64>()
                    })
                    .sum();
                let evictions = ring.evictions.load(std::sync::atomic::Ordering::Relaxed);
                (name.clone(), rows, evictions)
            })
            .collect();
        out.sort();
        out
    }

    fn ring(&self, limiter: &Arc<str>) -> Arc<Ring> {
        if let Some(r) = self.limiters.load().get(limiter) {
            return r.clone();
        }
        let _adding = self.adding.lock();
        let now = self.limiters.load_full();
        if let Some(r) = now.get(limiter) {
            return r.clone();
        }
        let ring = Arc::new(Ring::new());
        let mut next = Rings::clone(&now);
        next.insert(limiter.clone(), ring.clone());
        self.limiters.store(Arc::new(next));
        ring
    }

    /// Each limiter's top `n` over the last `minutes` minutes up to `now`, by refusals and by
    /// requests, largest first.
    pub(crate) fn top(&self, now: u64, minutes: u64, n: usize) -> Vec<LimiterTop> {
        let current = now / MINUTE_NS;
        let minutes = minutes.clamp(1, MINUTES as u64);
        let first = current.saturating_sub(minutes - 1);
        let rings: Vec<(Arc<str>, Arc<Ring>)> = self
            .limiters
            .load()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut out: Vec<LimiterTop> = rings
            .into_iter()
            .map(|(name, ring)| {
                // Stripes are locked one after another, always in this order; `record` takes one.
                let stripes: Vec<_> = ring.stripes.iter().map(|s| s.0.lock()).collect();
                let live: Vec<Vec<&Slot>> = stripes
                    .iter()
                    .map(|slots| {
                        slots
                            .iter()
                            .filter(|s| {
                                s.minute != u64::MAX && s.minute >= first && s.minute <= current
                            })
                            .collect()
                    })
                    .collect();
                let of = |pick: fn(&Slot) -> &Sketch| -> Vec<Vec<&Sketch>> {
                    live.iter()
                        .map(|slots| slots.iter().map(|s| pick(s)).collect())
                        .collect()
                };
                let (refused, refused_absent_bound) = merge(&of(|s| &s.refusals), n);
                let (requests, requests_absent_bound) = merge(&of(|s| &s.requests), n);
                LimiterTop {
                    limiter: name.to_string(),
                    refused,
                    requests,
                    refused_absent_bound,
                    requests_absent_bound,
                }
            })
            .collect();
        out.sort_by(|a, b| a.limiter.cmp(&b.limiter));
        out
    }
}

/// Each stripe's sketches (one per minute) summed by bucket, each row's error with the bound of
/// every sketch of its stripe that lacks it; the stripes' rows side by side (a bucket is in one
/// stripe only), the top `n` by count, and the bound of a bucket none of them holds: the largest
/// of the stripes' (it is in one of them, which one unknown).
fn merge(stripes: &[Vec<&Sketch>], n: usize) -> (Vec<Row>, u64) {
    let mut rows = Vec::new();
    let mut absent = 0;
    for sketches in stripes {
        absent = absent.max(merge_stripe(sketches, &mut rows));
    }
    sort_rows(&mut rows);
    let absent = truncate(&mut rows, n, absent);
    (rows, absent)
}

/// One stripe's sketches summed by bucket into `rows`; the bound of a bucket none holds.
fn merge_stripe(sketches: &[&Sketch], rows: &mut Vec<Row>) -> u64 {
    let mut sum: HashMap<&BucketKey, (u64, u64, &Seed)> = HashMap::new();
    for s in sketches {
        for (k, c) in &s.rows {
            let e = sum.entry(k).or_insert((0, 0, &c.seed));
            e.0 += c.count;
            e.1 += c.error;
        }
    }
    let bounds: Vec<u64> = sketches.iter().map(|s| s.absent_bound()).collect();
    rows.extend(sum.into_iter().map(|(k, (count, error, seed))| {
        let missing: u64 = sketches
            .iter()
            .zip(&bounds)
            .filter(|(s, b)| **b > 0 && !s.rows.contains_key(k))
            .map(|(_, b)| *b)
            .sum();
        let (who, address) = seed.label(&hex::encode(&k.digest[..6]));
        Row {
            bucket: k.to_string(),
            label: Label::new(who, address),
            count,
            error: error + missing,
        }
    }));
    bounds.iter().sum()
}

/// Keep the first `n` rows (at most [`MAX_ROWS`]); a bucket cut from the list may have had as
/// many as the first one cut, so the absent bound grows to it.
fn truncate(rows: &mut Vec<Row>, n: usize, absent: u64) -> u64 {
    let n = n.min(MAX_ROWS);
    let cut = rows.get(n).map_or(0, |r| r.count + r.error);
    rows.truncate(n);
    absent.max(cut)
}

/// Largest count first; ties by bucket, so every instance lists them alike.
pub(crate) fn sort_rows(rows: &mut [Row]) {
    rows.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.bucket.cmp(&b.bucket)));
}

/// What one instance publishes for others on a shared store: its lists per window.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Published {
    /// Unix seconds when it was written.
    pub at: u64,
    /// Per window (minutes, as in [`WINDOWS`]), the lists.
    pub windows: Vec<(u64, Vec<LimiterTop>)>,
}

/// Lists of several instances summed by limiter and bucket. A row one instance lacks adds that
/// instance's absent bound to its error.
pub(crate) fn merge_instances(all: &[Vec<LimiterTop>], n: usize) -> Vec<LimiterTop> {
    let mut names: Vec<String> = all
        .iter()
        .flat_map(|tops| tops.iter().map(|t| t.limiter.clone()))
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let of: Vec<Option<&LimiterTop>> = all
                .iter()
                .map(|tops| tops.iter().find(|t| t.limiter == name))
                .collect();
            let pick = |refused: bool| {
                let lists: Vec<(&[Row], u64)> = of
                    .iter()
                    .map(|t| match t {
                        Some(t) if refused => (t.refused.as_slice(), t.refused_absent_bound),
                        Some(t) => (t.requests.as_slice(), t.requests_absent_bound),
                        None => (&[][..], 0),
                    })
                    .collect();
                sum_lists(&lists, n)
            };
            let (refused, refused_absent_bound) = pick(true);
            let (requests, requests_absent_bound) = pick(false);
            LimiterTop {
                limiter: name,
                refused,
                requests,
                refused_absent_bound,
                requests_absent_bound,
            }
        })
        .collect()
}

fn sum_lists(lists: &[(&[Row], u64)], n: usize) -> (Vec<Row>, u64) {
    let mut sum: HashMap<&str, Row> = HashMap::new();
    for (rows, _) in lists {
        for r in *rows {
            sum.entry(r.bucket.as_str())
                .and_modify(|s| {
                    s.count += r.count;
                    s.error += r.error;
                })
                .or_insert_with(|| r.clone());
        }
    }
    let mut rows: Vec<Row> = sum
        .into_values()
        .map(|mut row| {
            for (list, bound) in lists {
                if !list.iter().any(|r| r.bucket == row.bucket) {
                    row.error += bound;
                }
            }
            row
        })
        .collect();
    sort_rows(&mut rows);
    let absent = truncate(&mut rows, n, lists.iter().map(|(_, b)| b).sum());
    (rows, absent)
}

/// The shared table every instance on one Redis store publishes its lists in.
const TABLE: &str = "top";
/// How often an instance publishes its lists.
pub(crate) const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// Rows per list an instance publishes (a bucket below them counts in the absent bound).
pub(crate) const PUBLISHED_ROWS: usize = 20;
/// An instance that has not published for this long has stopped: its lists are dropped.
const STALE_SECS: u64 = 30;

impl TopTalkers {
    /// Write this instance's lists of every window to the shared table, at `now` (ns on the
    /// decider's clock) and `unix` (seconds).
    pub(crate) async fn publish(
        &self,
        table: &dyn SharedTable,
        now: u64,
        unix: u64,
    ) -> Result<(), StoreError> {
        let windows = WINDOWS
            .iter()
            .map(|w| (*w, self.top(now, *w, PUBLISHED_ROWS)))
            .filter(|(_, tops)| tops.iter().any(|t| !t.requests.is_empty()))
            .collect::<Vec<_>>();
        let value = (!windows.is_empty())
            .then(|| serde_json::to_string(&Published { at: unix, windows }).ok())
            .flatten();
        table.write(TABLE, &self.instance, value.as_deref()).await
    }

    /// The lists other live instances published for a window of `minutes`; the lists of
    /// instances silent for [`STALE_SECS`] are removed from the table.
    pub(crate) async fn others(
        &self,
        table: &dyn SharedTable,
        minutes: u64,
        unix: u64,
    ) -> Result<Vec<Vec<LimiterTop>>, StoreError> {
        let (_, entries) = table.read(TABLE, u64::MAX).await?;
        let mut out = Vec::new();
        for (id, json) in entries.unwrap_or_default() {
            if id == self.instance {
                continue;
            }
            let Ok(p) = serde_json::from_str::<Published>(&json) else {
                continue;
            };
            if p.at.saturating_add(STALE_SECS) < unix {
                table.write(TABLE, &id, None).await?;
                continue;
            }
            if let Some((_, tops)) = p.windows.into_iter().find(|(w, _)| *w == minutes) {
                out.push(tops);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
