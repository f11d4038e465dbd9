//! The running gateway's configuration and the parts a reload swaps, shared by the admin
//! listener's handlers (`admin.rs`) and the operator's levers (`levers.rs`).

use crate::config::{Config, Loader};
use crate::decision::Decider;
use crate::http::cors::Cors;
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Reads the configuration again, from the same layers as at start.
pub(crate) type Reloader = Arc<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// A reloader for a configuration built without command-line flags: its file (if any) and
/// this process's environment. A calibration the admission rule refuses is rejected.
pub(crate) fn file_reloader(cfg: &Config) -> Reloader {
    let source = cfg.source.clone();
    Arc::new(move || {
        let mut l = Loader::new();
        if let Some(p) = &source {
            l = l.file(p);
        }
        let cfg = l.process_env().load().map_err(|e| e.to_string())?;
        crate::config::admit::admit(&cfg, false).map_err(|r| r.to_string())?;
        Ok(cfg)
    })
}

/// What a successful reload changed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct ReloadReport {
    /// Limiters that are new, gone, or whose definition changed.
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    /// Settings that differ but only take effect on restart.
    pub restart_required: Vec<&'static str>,
}

/// The running gateway's configuration and the parts a reload swaps.
pub(crate) struct Control {
    pub(super) decider: Arc<Decider>,
    pub(super) cors: Cors,
    pub(super) reloader: Reloader,
    pub(super) current: Mutex<Config>,
    /// The traffic listener's certificate, when it serves TLS: read again on every reload.
    pub(super) certs: Option<Arc<crate::tls::CertStore>>,
    /// Set when SIGTERM or SIGINT arrives: `/readyz` answers 503 from then on.
    pub(super) draining: AtomicBool,
    /// Overrides and resets at run time, shared through the store.
    pub(super) levers: Arc<crate::overrides::shared::Levers>,
    /// `store.require` as the process started (a reload cannot change it): `/readyz` answers
    /// 503 while the store does not answer.
    pub(super) store_required: bool,
}

impl Control {
    pub(crate) fn new(
        cfg: &Config,
        decider: Arc<Decider>,
        levers: Arc<crate::overrides::shared::Levers>,
        cors: Cors,
        reloader: Reloader,
    ) -> Self {
        Self {
            levers,
            decider,
            cors,
            reloader,
            current: Mutex::new(cfg.clone()),
            certs: None,
            draining: AtomicBool::new(false),
            store_required: cfg.store.require,
        }
    }

    /// Whether a signal to stop has arrived.
    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// From now on `/readyz` answers 503.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// `ops.drain_delay` of the configuration in effect (it changes on reload).
    pub(super) fn drain_delay(&self) -> Duration {
        self.current.lock().ops.drain_delay
    }

    /// Reload the traffic listener's certificate with the configuration.
    pub(crate) fn with_certificates(mut self, certs: Option<Arc<crate::tls::CertStore>>) -> Self {
        self.certs = certs;
        self
    }

    pub(crate) fn decider(&self) -> &Arc<Decider> {
        &self.decider
    }

    /// The configuration in effect.
    pub(crate) fn current_config(&self) -> Config {
        self.current.lock().clone()
    }

    /// Overrides and resets at run time.
    pub(crate) fn levers(&self) -> &Arc<crate::overrides::shared::Levers> {
        &self.levers
    }

    /// Read the configuration again and take it, or keep the old one and say why not.
    pub(crate) fn reload(&self, trigger: &str) -> Result<ReloadReport, String> {
        let mut current = self.current.lock();
        let new = match (self.reloader)() {
            Ok(c) => c,
            Err(e) => {
                // Configuration errors already hide secrets; a URL from elsewhere loses its password.
                let e = crate::redact::urls_in(&e).into_owned();
                // Logged before it is counted: whoever watches the counter finds the line written.
                tracing::error!(trigger, error = %e, "configuration reload rejected; the previous configuration stays in effect");
                self.decider.metrics().reloaded(false);
                return Err(e);
            }
        };
        // The listener's certificate is read before anything is swapped: files that cannot be
        // used reject the whole reload, and the certificate in use stays.
        let cert = match (
            &self.certs,
            &new.server.tls_cert_file,
            &new.server.tls_key_file,
        ) {
            (Some(_), Some(c), Some(k)) => match crate::tls::read_certified_key(c, k) {
                Ok(pair) => Some(pair),
                Err(e) => {
                    let e = format!(
                        "{}: server.tls_cert_file: {e:#}",
                        new.origin("server.tls_cert_file")
                    );
                    tracing::error!(trigger, error = %e, "configuration reload rejected; the previous configuration and certificate stay in effect");
                    self.decider.metrics().reloaded(false);
                    return Err(e);
                }
            },
            _ => None,
        };
        let report = diff(&current, &new);
        if let (Some(store), Some(pair)) = (&self.certs, cert) {
            store.set(pair);
            tracing::info!(
                trigger,
                "listener certificate reloaded: new connections get it, open ones keep theirs"
            );
        }
        self.decider.reload(&new);
        self.cors.set(&new.cors);
        if let Some(w) = new.identity.plain_http_warning() {
            tracing::warn!(trigger, "{w}");
        }
        if !report.restart_required.is_empty() {
            tracing::warn!(
                trigger,
                settings = ?report.restart_required,
                "these settings changed but only take effect on restart"
            );
        }
        tracing::info!(
            trigger,
            added = ?report.added,
            removed = ?report.removed,
            changed = ?report.changed,
            enabled = new.enabled,
            "configuration reloaded"
        );
        self.decider.metrics().reloaded(true);
        *current = new;
        Ok(report)
    }
}

fn diff(old: &Config, new: &Config) -> ReloadReport {
    let find = |c: &Config, n: &str| c.limiters.iter().find(|l| &*l.name == n).cloned();
    let mut r = ReloadReport {
        added: Vec::new(),
        removed: Vec::new(),
        changed: Vec::new(),
        restart_required: Vec::new(),
    };
    for l in &new.limiters {
        match find(old, &l.name) {
            None => r.added.push(l.name.to_string()),
            Some(o) if o != *l => r.changed.push(l.name.to_string()),
            Some(_) => {}
        }
    }
    for l in &old.limiters {
        if find(new, &l.name).is_none() {
            r.removed.push(l.name.to_string());
        }
    }
    r.restart_required = crate::config::settings::restart_required(old, new);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_names_changed_limiters_and_restart_only_settings() {
        let old = Config::default();
        let mut new = old.clone();
        let q = new.limiters[0].quota;
        new.limiters[0].quota = q.with_limit(crate::limiter::nonzero(q.limit() + 1));
        let gone = new.limiters.pop().expect("limiters").name.to_string();
        new.server.listen = "127.0.0.1:1".parse().expect("addr");
        new.ops.near_limit_percent = 50;
        let r = diff(&old, &new);
        assert_eq!(r.changed, vec![old.limiters[0].name.to_string()]);
        assert_eq!(r.removed, vec![gone]);
        assert!(r.added.is_empty());
        assert_eq!(
            r.restart_required,
            vec!["server.listen"],
            "near_limit_percent is live"
        );
        let same = diff(&old, &old.clone());
        assert!(same.changed.is_empty() && same.restart_required.is_empty());
        let mut cookie = old.clone();
        cookie.identity.session_cookie = "other".into();
        assert_eq!(diff(&old, &cookie).restart_required, vec!["identity"]);
        let mut ws = old.clone();
        ws.websocket.idle_timeout = std::time::Duration::from_secs(1);
        assert_eq!(diff(&old, &ws).restart_required, vec!["websocket"]);
    }
}
