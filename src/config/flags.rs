//! Command-line flags made from the table of settings: every setting's `serve` flag
//! ([`SettingFlags`]), and the flags the commands read themselves (`--config`,
//! `--allow-unsafe-calibration`). Each is a `clap` argument group to flatten into a command.

use super::settings::{CommandSetting, Setting, ALLOW_UNSAFE_CALIBRATION, CONFIG_FILE, SETTINGS};
use super::Loader;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use std::path::PathBuf;

/// The settings given as flags of `serve`, in the order of the table (a repeated flag in the
/// order given).
#[derive(Debug, Clone, Default)]
pub struct SettingFlags {
    given: Vec<(&'static Setting, String)>,
}

impl SettingFlags {
    /// `loader` with these flags as its last layer.
    pub fn apply(&self, mut loader: Loader) -> Loader {
        for (s, value) in &self.given {
            if let Some(f) = s.flag {
                loader = loader.flag(s.path, value.clone(), &format!("--{}", f.name));
            }
        }
        loader
    }
}

fn setting_arg(s: &Setting) -> Option<Arg> {
    let f = s.flag?;
    Some(
        Arg::new(f.name)
            .long(f.name)
            .value_name(f.value_name)
            .help(s.flag_help())
            .action(if f.repeatable {
                ArgAction::Append
            } else {
                ArgAction::Set
            }),
    )
}

impl FromArgMatches for SettingFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Self::default();
        flags.update_from_arg_matches(m)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        for s in SETTINGS {
            let Some(f) = s.flag else { continue };
            if let Some(values) = m.get_many::<String>(f.name) {
                self.given.retain(|(g, _)| g.path != s.path);
                self.given.extend(values.map(|v| (s, v.clone())));
            }
        }
        Ok(())
    }
}

impl Args for SettingFlags {
    fn augment_args(cmd: Command) -> Command {
        cmd.args(SETTINGS.iter().filter_map(setting_arg))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// A flag the command reads itself, also taken from its environment variable.
fn command_arg(c: &CommandSetting) -> Arg {
    let name = c.flag.map_or(c.variable, |f| f.name);
    let arg = Arg::new(name).long(name).env(c.variable).help(c.help);
    match c.flag {
        Some(f) if !f.value_name.is_empty() => arg.value_name(f.value_name).action(ArgAction::Set),
        _ => arg
            .action(ArgAction::SetTrue)
            .value_parser(clap::builder::BoolishValueParser::new()),
    }
}

/// `--config FILE` (`FLEET_LIMITER_CONFIG`): the TOML file every command reads.
#[derive(Debug, Clone, Default)]
pub struct ConfigFile(pub Option<PathBuf>);

impl ConfigFile {
    /// A loader of this file (if any) and this process's environment.
    pub fn loader(&self) -> Loader {
        let l = Loader::new();
        match &self.0 {
            Some(path) => l.file(path),
            None => l,
        }
        .process_env()
    }
}

fn flag_name(c: &CommandSetting) -> &'static str {
    c.flag.map_or(c.variable, |f| f.name)
}

impl FromArgMatches for ConfigFile {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self(
            m.get_one::<String>(flag_name(&CONFIG_FILE))
                .map(PathBuf::from),
        ))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for ConfigFile {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(command_arg(&CONFIG_FILE))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// `--allow-unsafe-calibration` (`FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION`): start, and accept
/// reloads, even when the calibration check finds a limiter unsafe.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowUnsafeCalibration(pub bool);

impl FromArgMatches for AllowUnsafeCalibration {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self(m.get_flag(flag_name(&ALLOW_UNSAFE_CALIBRATION))))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for AllowUnsafeCalibration {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(command_arg(&ALLOW_UNSAFE_CALIBRATION))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        cfg: ConfigFile,
        #[command(flatten)]
        settings: SettingFlags,
        #[command(flatten)]
        unsafe_ok: AllowUnsafeCalibration,
    }

    fn parse(args: &[&str]) -> Result<Serve, clap::Error> {
        use clap::Parser;
        Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
    }

    #[test]
    fn every_flag_of_the_table_reaches_its_setting() {
        for s in SETTINGS {
            let Some(f) = s.flag else { continue };
            let parsed = parse(&[&format!("--{}", f.name), "v"]).expect("parses");
            let given: Vec<_> = parsed
                .settings
                .given
                .iter()
                .map(|(s, v)| (s.path, v.as_str()))
                .collect();
            assert_eq!(given, [(s.path, "v")], "--{}", f.name);
        }
    }

    #[test]
    fn a_repeatable_flag_adds_up_and_another_is_refused_twice() {
        let p = parse(&["--trust-proxy", "10.0.0.0/8", "--trust-proxy", "::1"]).expect("parses");
        let c = p.settings.apply(Loader::new()).load().expect("loads");
        assert_eq!(c.client_ip.trusted.ranges.len(), 2);
        assert_eq!(
            c.origin("client_ip.trust_proxy"),
            "flag --trust-proxy".to_owned()
        );
        assert!(parse(&["--listen", "127.0.0.1:1", "--listen", "127.0.0.1:2"]).is_err());
    }

    #[test]
    fn a_flag_overrides_the_environment_and_names_itself() {
        let p = parse(&["--listen", "127.0.0.1:9", "--config", "x.toml"]).expect("parses");
        assert_eq!(p.cfg.0, Some(PathBuf::from("x.toml")));
        assert!(!p.unsafe_ok.0);
        let c = p
            .settings
            .apply(
                Loader::new().env([("FLEET_LIMITER_LISTEN".to_owned(), "127.0.0.1:8".to_owned())]),
            )
            .load()
            .expect("loads");
        assert_eq!(c.server.listen.port(), 9);
        assert_eq!(c.origin("server.listen"), "flag --listen");
        assert!(
            parse(&["--allow-unsafe-calibration"])
                .expect("parses")
                .unsafe_ok
                .0
        );
    }
}
