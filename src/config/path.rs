//! `[path]`: which spellings of a request path are refused with 400 (the default, for each
//! class) and which pass with their bytes kept as sent. See [`crate::path`].

use super::{ConfigError, Ctx};
use crate::path::{Class, PathRules};
use serde::Deserialize;

/// What the gateway does with a path of one class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum PathAction {
    Reject,
    Allow,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPath {
    invalid_escape: Option<PathAction>,
    invalid_utf8: Option<PathAction>,
    encoded_slash: Option<PathAction>,
    backslash: Option<PathAction>,
    semicolon: Option<PathAction>,
    control: Option<PathAction>,
    segment_edge: Option<PathAction>,
}

impl RawPath {
    fn action(&self, class: Class) -> Option<PathAction> {
        match class {
            Class::InvalidEscape => self.invalid_escape,
            Class::InvalidUtf8 => self.invalid_utf8,
            Class::EncodedSlash => self.encoded_slash,
            Class::Backslash => self.backslash,
            Class::Semicolon => self.semicolon,
            Class::Control => self.control,
            Class::SegmentEdge => self.segment_edge,
            // Refused by the decision endpoint only, whatever the settings say.
            Class::DotSegment
            | Class::EmptySegment
            | Class::EscapeSpelling
            | Class::Unescaped
            | Class::Fragment
            | Class::NotOriginForm => None,
        }
    }
}

pub(super) fn build_path(raw: RawPath, ctx: &Ctx) -> Result<PathRules, ConfigError> {
    let mut rules = PathRules::STRICT;
    for class in Class::CONFIGURABLE {
        let Some(setting) = class.setting() else {
            continue;
        };
        if raw.action(class) == Some(PathAction::Allow) {
            rules = rules.allowing(class);
            tracing::debug!(
                origin = %ctx.origin(&format!("path.{setting}")),
                class = class.as_str(),
                "paths of this class are forwarded as sent instead of refused"
            );
        }
    }
    Ok(rules)
}
