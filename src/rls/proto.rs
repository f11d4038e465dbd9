//! The messages of `envoy.service.ratelimit.v3.RateLimitService`, written by hand with prost's
//! derive, their field numbers exactly as envoy's `api/envoy/service/ratelimit/v3/rls.proto`,
//! `api/envoy/extensions/common/ratelimit/v3/ratelimit.proto` and
//! `api/envoy/config/core/v3/base.proto` (`HeaderValue`) give them. Fields this service does
//! not read or write (`raw_body`, `dynamic_metadata`, `quota`) are left out: prost skips them
//! on the wire.

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// 0 means 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// The descriptor's own limit (`RateLimitOverride`).
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// `google.protobuf.UInt64Value hits_addend`: this descriptor's own cost, when set.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Entry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimitOverride {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`: 1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year,
    /// 7 week.
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl Duration {
    pub(crate) fn from_nanos(ns: u64) -> Self {
        Self {
            seconds: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX),
            nanos: i32::try_from(ns % 1_000_000_000).unwrap_or(0),
        }
    }
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimitResponse {
    /// [`Code`].
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
}

/// `RateLimitResponse.Code` (`UNKNOWN = 0` is never answered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Code {
    Ok = 1,
    OverLimit = 2,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimit {
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `RateLimit.Unit`: 1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year, 7 week.
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DescriptorStatus {
    /// [`Code`].
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn field_numbers_are_envoys() {
        // domain "d" (1), one descriptor (2) with entry {k: "a", v: "b"} (1 -> 1, 2),
        // hits_addend 3 (3).
        let req = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "a".into(),
                    value: "b".into(),
                }],
                limit: None,
                hits_addend: None,
            }],
            hits_addend: 3,
        };
        assert_eq!(
            req.encode_to_vec(),
            [0x0a, 1, b'd', 0x12, 8, 0x0a, 6, 0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 3]
        );
        let status = DescriptorStatus {
            code: Code::OverLimit as i32,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: Some(Duration::from_nanos(1_500_000_000)),
        };
        assert_eq!(
            status.encode_to_vec(),
            [0x08, 2, 0x22, 8, 0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01]
        );
    }
}
