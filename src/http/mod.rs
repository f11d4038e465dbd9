//! HTTP glue: the middleware, the responses it renders, and the streaming proxy.

pub(crate) mod admin;
pub(crate) mod admin_client;
mod admin_guard;
mod body_keys;
pub(crate) mod control;
pub(crate) mod cors;
pub(crate) mod demo_upstream;
mod early;
pub(crate) mod forward_auth;
#[cfg(feature = "actix-governor")]
pub(crate) mod governor;
pub(crate) mod levers;
pub(crate) mod listeners;
pub(crate) mod middleware;
pub(crate) mod proxy;
pub(crate) mod request;
pub(crate) mod response;
mod rewrite;
mod shaping;
mod top;
