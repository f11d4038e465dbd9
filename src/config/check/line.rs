//! One limiter's line of the report: the judge's findings in words, its mode applied, the
//! limiter's settings as configured, and the smallest change the judge accepts.

use super::judge::{effective_limit, judge_loads, Judged};
use super::types::{CostShown, KnownTable, LimiterCheck, Status};
use super::workload::Model;
use crate::limiter::Algorithm;
use crate::policy::{Cost, Count, LimiterSpec, Meter, Mode};

/// One limiter's line of the report.
pub(super) fn line(l: &LimiterSpec, model: &Model, table: &KnownTable) -> LimiterCheck {
    let Judged {
        loads,
        mut status,
        mut findings,
    } = judge_loads(l, model, table);
    if l.disclose && l.key.names_target() {
        findings.push(super::findings::Finding::Discloses {
            key: l.key.to_string(),
        });
        status = status.max(Status::Warning);
    }
    let mut reasons: Vec<(String, Status)> = findings
        .iter()
        .map(|f| (f.sentence(), f.status()))
        .collect();
    match l.mode {
        Mode::Off => {
            // Never consulted: nothing it would do is a finding.
            status = Status::Off;
            for (_, s) in &mut reasons {
                *s = Status::Off;
            }
        }
        Mode::Shadow if status >= Status::AtRisk => {
            status = Status::Warning;
            for (r, s) in &mut reasons {
                *r = super::wording::in_shadow(r);
                *s = Status::Warning;
            }
        }
        _ => {}
    }
    // Suggestions for what the limiter would refuse once enforced; off and shadow refuse nothing.
    let suggested = if status >= Status::AtRisk {
        super::suggest::suggest(l, model, table)
    } else {
        super::suggest::Suggested {
            suggestion: None,
            alternatives: Vec::new(),
            no_fix: None,
        }
    };
    let limit = effective_limit(l);
    let window = l.quota.window().as_secs_f64();
    let fixed = l.quota.algorithm == Algorithm::FixedWindow;
    let (reasons, reason_status) = reasons.into_iter().unzip();
    LimiterCheck {
        name: l.name.to_string(),
        limit: l.quota.limit(),
        requests_per_window: limit,
        window_seconds: window,
        algorithm: l.quota.algorithm.as_str(),
        calendar: l
            .quota
            .calendar_window()
            .map(|c| format!("{} {}", c.unit.as_str(), c.zone.name())),
        refill_interval_seconds: if fixed { window } else { window / limit as f64 },
        key: super::suggest::key_text(l),
        meter: if l.new_agents.is_some() {
            Meter::NewAgents.as_str()
        } else {
            Meter::Requests.as_str()
        },
        count: l.count.as_str(),
        failed_statuses: (l.count != Count::All).then(|| l.failed_statuses.to_string()),
        cost: match &l.cost {
            Cost::Fixed(n) => CostShown::Fixed { units: n.get() },
            Cost::Header { name, max } => CostShown::Header {
                header: name.to_string(),
                max: max.get(),
            },
        },
        mode: l.mode.as_str(),
        loads,
        status,
        reasons,
        reason_status,
        suggestion: suggested.suggestion,
        alternatives: suggested.alternatives,
        no_fix: suggested.no_fix,
    }
}
