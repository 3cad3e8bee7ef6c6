//! A driver file, `balancers/NAME.toml`: a product's configuration as a template
//! filled from the case, how to start, reload and stop it, how to drain a backend, how
//! to read its own view of each backend, and what it cannot do. The format is
//! documented in `balancers/README.md`.
//!
//! Every template in the file is rendered at load time against two sample cases (one
//! with every option on, one with all off), so a field the case does not provide is
//! refused with the file and line before anything starts.

use std::path::Path;

use minijinja::{Environment, UndefinedBehavior, value::Serde};
use toml::Spanned;

pub use super::spec::{Action, CsvRule, JsonRule, LogRule, LogSpec, PromRule, View};
use super::{Feature, spec::Spec};

/// A driver file, parsed and checked.
#[derive(Debug)]
pub struct Driver {
    /// The product's name, in reports.
    pub name: String,
    /// Where it came from: a path, or `balancers/NAME.toml` for the bundled ones.
    pub origin: String,
    text: String,
    spec: Spec,
}

/// A bad driver file: where and why.
#[derive(Debug, thiserror::Error)]
#[error("{origin}:{line}: {why}")]
pub struct FileError {
    /// The file.
    pub origin: String,
    /// Its line (1-based).
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

/// The bundled drivers: `--balancer NAME`.
pub const BUNDLED: &[(&str, &str)] = &[
    ("haproxy", include_str!("../../../balancers/haproxy.toml")),
    ("nginx", include_str!("../../../balancers/nginx.toml")),
    ("caddy", include_str!("../../../balancers/caddy.toml")),
    ("traefik", include_str!("../../../balancers/traefik.toml")),
];

impl Driver {
    /// A bundled driver by name.
    pub fn bundled(name: &str) -> Option<Result<Driver, FileError>> {
        let (_, text) = BUNDLED.iter().find(|(n, _)| *n == name)?;
        Some(Driver::parse(text, &format!("balancers/{name}.toml")))
    }

    /// A user's driver file.
    pub fn load(path: &Path) -> Result<Driver, FileError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| FileError {
            origin: origin.clone(),
            line: 1,
            why: format!("could not read it: {e}"),
        })?;
        Driver::parse(&text, &origin)
    }

    /// Parses and checks `text`, which came from `origin`.
    pub fn parse(text: &str, origin: &str) -> Result<Driver, FileError> {
        let spec: Spec = toml::from_str(text).map_err(|e| FileError {
            origin: origin.into(),
            line: e.span().map_or(1, |s| line_of(text, s.start)),
            why: e.message().trim().to_string(),
        })?;
        let driver = Driver {
            name: spec.name.clone(),
            origin: origin.into(),
            text: text.into(),
            spec,
        };
        driver.check()?;
        Ok(driver)
    }

    fn error(&self, at: usize, why: impl Into<String>) -> FileError {
        FileError {
            origin: self.origin.clone(),
            line: line_of(&self.text, at),
            why: why.into(),
        }
    }

    /// What a file can get wrong beyond its syntax: unknown features, actions that
    /// say nothing or two things, an empty command, a template naming a field the
    /// case does not give.
    fn check(&self) -> Result<(), FileError> {
        let s = &self.spec;
        let command = &s.start.command;
        if command
            .get_ref()
            .first()
            .is_none_or(|p| p.trim().is_empty())
        {
            return Err(self.error(command.span().start, "[start] command is empty"));
        }
        for key in s.unsupported.keys() {
            if Feature::from_name(key.get_ref()).is_none() {
                return Err(self.error(
                    key.span().start,
                    format!(
                        "[unsupported] {:?} is no feature snag knows; one of {}",
                        key.get_ref(),
                        Feature::ALL.map(|f| f.name()).join(", ")
                    ),
                ));
            }
        }
        let actions = [
            ("reload", &s.reload),
            ("drain", &s.drain),
            ("maintenance", &s.maintenance),
        ];
        for (table, action) in actions {
            if let Some(a) = action {
                self.check_action(table, a)?;
            }
        }
        if s.drain.as_ref().is_some_and(|d| d.reload) && s.reload.is_none() {
            return Err(self.error(0, "[drain] reload = true needs a [reload] table"));
        }
        if let Some(v) = &s.view {
            let rules = [
                v.csv.is_some(),
                v.json.is_some(),
                v.prometheus.is_some(),
                v.log.is_some(),
            ];
            if rules.iter().filter(|r| **r).count() != 1 {
                return Err(self.error(
                    0,
                    "[view] needs exactly one rule to read the answer: csv, json, prometheus or log",
                ));
            }
            let asks = v.socket.is_some() || v.url.is_some() || v.command.is_some();
            if v.log.is_some() {
                if asks {
                    return Err(self.error(0, "[view] with a log rule asks nothing"));
                }
                if v.states.is_empty() {
                    return Err(self.error(0, "[view] with a log rule needs its states"));
                }
            } else {
                self.check_action("view", &v.query())?;
            }
        }
        if let Some(c) = &s.retries {
            self.check_action("retries", &c.query())?;
            let others = c.json.is_some() || c.log.is_some() || !c.states.is_empty();
            if c.csv.is_some() == c.prometheus.is_some() || others {
                return Err(self.error(
                    0,
                    "[retries] needs exactly one rule to read the answer: csv or prometheus",
                ));
            }
        }
        for sample in [Sample::AllOn, Sample::AllOff] {
            let context = sample.context();
            for (template, at) in self.templates() {
                self.fill(template, at, &context)?;
            }
        }
        Ok(())
    }

    fn check_action(&self, table: &str, a: &Action) -> Result<(), FileError> {
        let kinds = [
            a.socket.is_some(),
            a.url.is_some(),
            a.command.is_some(),
            a.signal.is_some(),
            a.reload,
            a.watched,
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(self.error(
                0,
                format!(
                    "[{table}] needs exactly one of socket, url, command, signal, reload, watched"
                ),
            ));
        }
        if a.reload && table != "drain" {
            return Err(self.error(0, format!("[{table}] reload = true is for [drain] only")));
        }
        if a.watched && table != "reload" {
            return Err(self.error(0, format!("[{table}] watched = true is for [reload] only")));
        }
        if a.socket.is_some() != a.send.is_some() {
            return Err(self.error(0, format!("[{table}] socket and send go together")));
        }
        if let Some(signal) = &a.signal {
            signal_by_name(signal).map_err(|why| self.error(0, format!("[{table}] {why}")))?;
        }
        if let Some(c) = &a.command
            && c.get_ref().first().is_none_or(|p| p.trim().is_empty())
        {
            return Err(self.error(c.span().start, format!("[{table}] command is empty")));
        }
        Ok(())
    }

    /// Every template in the file with the byte offset where its text begins.
    fn templates(&self) -> Vec<(&str, usize)> {
        let s = &self.spec;
        let mut out = vec![(
            s.config.template.get_ref().as_str(),
            body_start(&self.text, s.config.template.span().start),
        )];
        fn string<'a>(out: &mut Vec<(&'a str, usize)>, t: &'a Option<Spanned<String>>) {
            if let Some(t) = t {
                out.push((t.get_ref().as_str(), t.span().start));
            }
        }
        string(&mut out, &s.start.ready_url);
        let actions = [s.reload.as_ref(), s.drain.as_ref(), s.maintenance.as_ref()];
        let mut commands = vec![&s.start.command];
        if let Some(v) = &s.view {
            string(&mut out, &v.socket);
            string(&mut out, &v.send);
            string(&mut out, &v.url);
            commands.extend(v.command.as_ref());
        }
        if let Some(c) = &s.retries {
            string(&mut out, &c.socket);
            string(&mut out, &c.send);
            string(&mut out, &c.url);
            commands.extend(c.command.as_ref());
        }
        for a in actions.into_iter().flatten() {
            string(&mut out, &a.socket);
            string(&mut out, &a.send);
            string(&mut out, &a.url);
            string(&mut out, &a.body);
            string(&mut out, &a.applied_url);
            string(&mut out, &a.applied_when);
            commands.extend(a.command.as_ref());
        }
        for c in commands {
            for arg in c.get_ref() {
                out.push((arg.as_str(), c.span().start));
            }
        }
        out
    }

    /// `template` (found at byte `at` of the file) filled from `context`.
    fn fill(
        &self,
        template: &str,
        at: usize,
        context: &serde_json::Value,
    ) -> Result<String, FileError> {
        environment()
            .render_str(template, Serde(context))
            .map_err(|e| FileError {
                origin: self.origin.clone(),
                line: line_of(&self.text, at) + e.line().unwrap_or(1) - 1,
                why: match e.detail() {
                    Some(detail) => format!("{}: {detail}", e.kind()),
                    None => e.kind().to_string(),
                },
            })
    }

    /// The configuration text for `context`.
    pub fn config_text(&self, context: &serde_json::Value) -> Result<String, FileError> {
        let t = &self.spec.config.template;
        self.fill(t.get_ref(), body_start(&self.text, t.span().start), context)
    }

    /// A string of the file (a URL, a socket path …) filled from `context`.
    pub fn string(
        &self,
        s: &Spanned<String>,
        context: &serde_json::Value,
    ) -> Result<String, FileError> {
        self.fill(s.get_ref(), s.span().start, context)
    }

    /// A command of the file filled from `context`.
    pub fn command(
        &self,
        c: &Spanned<Vec<String>>,
        context: &serde_json::Value,
    ) -> Result<Vec<String>, FileError> {
        c.get_ref()
            .iter()
            .map(|arg| self.fill(arg, c.span().start, context))
            .collect()
    }

    /// The name of the configuration file in the run's directory.
    pub fn config_file(&self) -> &str {
        &self.spec.config.file
    }

    /// One line about the product, from the file.
    pub fn about(&self) -> &str {
        &self.spec.about
    }

    /// `[start]`'s command.
    pub fn start_command(&self) -> &Spanned<Vec<String>> {
        &self.spec.start.command
    }

    /// A URL that answers 200 once the product routes with its configuration.
    pub fn ready_url(&self) -> Option<&Spanned<String>> {
        self.spec.start.ready_url.as_ref()
    }

    /// The command printing the product's version.
    pub fn version_command(&self) -> Option<&[String]> {
        self.spec.start.version.as_deref()
    }

    /// The signal that stops it gracefully.
    pub fn stop_signal(&self) -> nix::sys::signal::Signal {
        signal_by_name(&self.spec.start.stop_signal).unwrap_or(nix::sys::signal::Signal::SIGTERM)
    }

    /// `[reload]`, `[drain]`, `[maintenance]`.
    pub fn reload(&self) -> Option<&Action> {
        self.spec.reload.as_ref()
    }

    /// See [`Driver::reload`].
    pub fn drain(&self) -> Option<&Action> {
        self.spec.drain.as_ref()
    }

    /// See [`Driver::reload`].
    pub fn maintenance(&self) -> Option<&Action> {
        self.spec.maintenance.as_ref()
    }

    /// `[view]`.
    pub fn view(&self) -> Option<&View> {
        self.spec.view.as_ref()
    }

    /// `[retries]`.
    pub fn retries(&self) -> Option<&View> {
        self.spec.retries.as_ref()
    }

    /// `[log]`.
    pub fn log(&self) -> Option<&LogSpec> {
        self.spec.log.as_ref()
    }

    /// Why the product cannot do `feature`, or `None` when it can: the file's
    /// `[unsupported]` reason, or the table the file lacks for it.
    pub fn lacks(&self, feature: Feature) -> Option<String> {
        if let Some((_, why)) = self
            .spec
            .unsupported
            .iter()
            .find(|(k, _)| k.get_ref() == feature.name())
        {
            return Some(why.clone());
        }
        let missing = match feature {
            Feature::Drain if self.spec.drain.is_none() => "[drain]",
            Feature::View if self.spec.view.is_none() => "[view]",
            Feature::RetryCount if self.spec.retries.is_none() => "[retries]",
            _ => return None,
        };
        Some(format!("its driver file {} has no {missing}", self.origin))
    }
}

/// A signal named as in `kill -l` (HUP, TERM, USR2 …).
pub fn signal_by_name(name: &str) -> Result<nix::sys::signal::Signal, String> {
    let full = format!("SIG{}", name.trim_start_matches("SIG"));
    full.parse()
        .map_err(|_| format!("{name:?} is no signal (HUP, TERM, USR1, USR2, QUIT …)"))
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.add_filter("json", |v: minijinja::Value| {
        serde_json::to_string(&v).map_err(|e| {
            minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
        })
    });
    env.add_filter("regex_escape", |s: String| {
        s.chars().fold(String::new(), |mut out, c| {
            if "\\.+*?()|[]{}^$#&-~".contains(c) {
                out.push('\\');
            }
            out.push(c);
            out
        })
    });
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env
}

/// The 1-based line of byte `at`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Where the text of the string literal at `at` begins: past its quotes, and past
/// the newline TOML drops right after `'''` or `"""`.
fn body_start(text: &str, at: usize) -> usize {
    let rest = &text[at.min(text.len())..];
    let quotes = if rest.starts_with("'''") || rest.starts_with("\"\"\"") {
        3
    } else {
        1
    };
    let after = at + quotes;
    match text.as_bytes().get(after) {
        Some(b'\n') => after + 1,
        Some(b'\r') => after + 2,
        _ => after,
    }
}

/// The two cases every template is tried against when the file loads.
#[derive(Clone, Copy)]
enum Sample {
    AllOn,
    AllOff,
}

impl Sample {
    fn context(self) -> serde_json::Value {
        use super::context::{Context, backend_sample};
        let on = matches!(self, Sample::AllOn);
        let mut c = Context::sample(on);
        c.backend = Some(backend_sample(on));
        c.draining = on;
        serde_json::to_value(c).expect("a context serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_starts_on_the_line_after_triple_quotes() {
        let text = "a = 1\nt = '''\nline one\n'''\n";
        let at = text.find("'''").unwrap();
        assert_eq!(line_of(text, body_start(text, at)), 3);
        let text = "t = \"x\"";
        assert_eq!(body_start(text, 4), 5);
    }

    fn error(text: &str) -> FileError {
        Driver::parse(text, "mine.toml").expect_err("the file is refused")
    }

    const GOOD: &str = r#"name = "mine"
[config]
file = "mine.conf"
template = '''
listen {{ listen.addr }}
{% for b in backends %}
server {{ b.id }} {{ b.addr }}
{% endfor %}
'''
[start]
command = ["mine", "-c", "{{ config_file }}"]
"#;

    #[test]
    fn a_good_file_loads_and_fills_its_template() {
        let driver = Driver::parse(GOOD, "mine.toml").unwrap();
        let context = serde_json::to_value(super::super::Context::sample(false)).unwrap();
        assert_eq!(
            driver.config_text(&context).unwrap(),
            "listen 127.0.0.1:8080\nserver a 127.0.0.1:9001\nserver b 127.0.0.1:9002\n"
        );
        // Without the tables, what they give is lacking, with the file's name.
        let why = driver.lacks(Feature::Drain).unwrap();
        assert!(why.contains("mine.toml has no [drain]"), "{why}");
        assert_eq!(driver.lacks(Feature::StrategyRr), None);
    }

    #[test]
    fn the_bundled_drivers_load() {
        for (name, _) in BUNDLED {
            let driver = Driver::bundled(name).unwrap().unwrap();
            assert_eq!(driver.name, *name);
        }
    }

    #[test]
    fn a_malformed_file_is_refused_with_its_line() {
        let e = error("name = \"x\"\n[config]\nfile = \n");
        assert_eq!((e.origin.as_str(), e.line), ("mine.toml", 3), "{e}");
        let e = error(&GOOD.replace("[start]", "[start]\nbogus = 1"));
        assert!(e.why.contains("unknown field `bogus`"), "{e}");
        assert_eq!(e.line, 11, "{e}");
    }

    #[test]
    fn a_missing_or_empty_command_is_refused() {
        let e = error(&GOOD.replace("command = [\"mine\", \"-c\", \"{{ config_file }}\"]", ""));
        assert!(e.why.contains("missing field `command`"), "{e}");
        let e = error(&GOOD.replace("[\"mine\", \"-c\", \"{{ config_file }}\"]", "[]"));
        assert_eq!(e.line, 11, "{e}");
        assert!(e.why.contains("command is empty"), "{e}");
    }

    #[test]
    fn a_template_naming_an_unknown_field_is_refused_at_its_line() {
        let e = error(&GOOD.replace("server {{ b.id }}", "server {{ b.name }}"));
        assert_eq!((e.origin.as_str(), e.line), ("mine.toml", 7), "{e}");
        assert!(e.why.contains("undefined"), "{e}");
        // In a branch only the all-on sample takes.
        let e = error(&GOOD.replace(
            "listen {{ listen.addr }}",
            "listen {{ listen.addr }}\n{% if health %}{{ health.every }}{% endif %}",
        ));
        assert_eq!(e.line, 6, "{e}");
        // In a command.
        let e = error(&GOOD.replace("{{ config_file }}", "{{ conf }}"));
        assert_eq!(e.line, 11, "{e}");
        let e = error(&GOOD.replace("{% endfor %}", ""));
        assert!(e.why.contains("syntax error"), "{e}");
    }

    #[test]
    fn unknown_features_and_bad_actions_are_refused() {
        let e = error(&format!("{GOOD}[unsupported]\nteleport = \"no\"\n"));
        assert_eq!(e.line, 13, "{e}");
        assert!(e.why.contains("\"teleport\" is no feature"), "{e}");
        let e = error(&format!(
            "{GOOD}[drain]\nsignal = \"HUP\"\nurl = \"http://x/\"\n"
        ));
        assert!(e.why.contains("[drain] needs exactly one of"), "{e}");
        let e = error(&format!("{GOOD}[reload]\nsignal = \"HUPP\"\n"));
        assert!(e.why.contains("no signal"), "{e}");
        let e = error(&format!("{GOOD}[drain]\nreload = true\n"));
        assert!(e.why.contains("needs a [reload]"), "{e}");
        let e = error(&format!("{GOOD}[view]\nurl = \"http://x/\"\n"));
        assert!(e.why.contains("exactly one rule"), "{e}");
    }

    #[test]
    fn signals_by_name() {
        assert_eq!(
            signal_by_name("HUP").unwrap(),
            nix::sys::signal::Signal::SIGHUP
        );
        assert!(signal_by_name("HUPP").unwrap_err().contains("no signal"));
    }
}
