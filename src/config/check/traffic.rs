//! The requests of the modelled fleet: what agents, installers, dashboards and CLI clients send.

/// An agent's heartbeat; the backend marks the agent offline when none arrives in time.
pub(crate) const HEARTBEAT: (&str, &str) = ("POST", "/api/agent/heartbeat");
/// An agent polling for tasks.
pub(crate) const POLL: (&str, &str) = ("GET", "/api/agent/tasks");
/// An agent posting one task result.
pub(crate) const RESULT: (&str, &str) = ("POST", "/api/agent/tasks/result");
/// An installer downloading the agent binary.
pub(crate) const DOWNLOAD: (&str, &str) = ("GET", "/api/agent/download/fleet-agent");
/// An installer enrolling a new endpoint.
pub(crate) const ENROLL: (&str, &str) = ("POST", "/api/agent/enroll");
/// A dashboard page polling the API.
pub(crate) const DASHBOARD: (&str, &str) = ("GET", "/api/tasks");
/// Widgets an open dashboard page refreshes on every poll, one request each: the agent or
/// task list, its counters and the analytics panels beside it (the page's first load fans
/// out wider, across thirty-odd endpoints, and is a one-off burst).
pub(crate) const DASHBOARD_WIDGETS_PER_PAGE: u64 = 5;
/// Requests one open dashboard sends every `fleet.dashboard_poll_seconds`: its page's
/// widgets and the notification bell.
pub(crate) const DASHBOARD_REQUESTS_PER_POLL: u64 = DASHBOARD_WIDGETS_PER_PAGE + 1;

/// The dashboard load: requests per minute one analyst's open dashboard sends,
/// [`DASHBOARD_REQUESTS_PER_POLL`] every `dashboard_poll_seconds` (6 every 10 s: 36 a
/// minute). `check` and `simulate` both use it, and docs/calibration.md states it.
pub(crate) fn dashboard_per_minute(dashboard_poll_seconds: std::num::NonZeroU64) -> f64 {
    DASHBOARD_REQUESTS_PER_POLL as f64 * 60.0 / dashboard_poll_seconds.get() as f64
}
/// A CLI polling the device-authorisation token endpoint while its user logs in.
pub(crate) const DEVICE_POLL: (&str, &str) = ("POST", "/api/cli/auth/device/token");
/// How often a CLI polls during the device flow: the default `interval` of RFC 8628.
pub(crate) const DEVICE_POLL_SECONDS: u64 = 5;
