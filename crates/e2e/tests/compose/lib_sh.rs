//! scripts/lib.sh, the native scripts' one list of services, ports, databases and
//! topics, read as text.

use regex::Regex;
use saga_e2e::workspace_root;

use crate::read;

/// scripts/lib.sh read as text, not run: only the simple shapes it uses for its
/// settings are understood, and any other shape fails the test naming what to update.
pub(crate) struct LibSh {
    pub(crate) text: String,
}

impl LibSh {
    pub(crate) fn load() -> Self {
        Self {
            text: read(&workspace_root().join("scripts/lib.sh")),
        }
    }

    pub(crate) fn changed(&self, what: &str) -> ! {
        panic!(
            "scripts/lib.sh: cannot find {what} in the shape this test parses; \
             if lib.sh changed, update crates/e2e/tests/compose.rs to match"
        )
    }

    /// `NAME=(a b c)`, on one line or several, with comments.
    pub(crate) fn array(&self, name: &str) -> Vec<String> {
        let start = Regex::new(&format!(r"(?m)^{name}=\(")).unwrap();
        let found = start
            .find(&self.text)
            .unwrap_or_else(|| self.changed(&format!("the array {name}=(...)")));
        let body = &self.text[found.end()..];
        let body = &body[..body
            .find(')')
            .unwrap_or_else(|| self.changed(&format!("the end of {name}=(...)")))];
        let words: Vec<String> = body
            .lines()
            .map(|line| line.split('#').next().unwrap())
            .flat_map(str::split_whitespace)
            .map(str::to_owned)
            .collect();
        if words.is_empty() {
            self.changed(&format!("elements in {name}=(...)"));
        }
        words
    }

    /// `NAME=value`, `NAME="value"` or `NAME="${OVERRIDE:-value}"`: the value (the
    /// default, when the environment may override it).
    pub(crate) fn scalar(&self, name: &str) -> String {
        let line = Regex::new(&format!(
            r#"(?m)^{name}=(?:"\$\{{[A-Z_]+:-([^}}"]*)\}}"|"([^"$]*)"|([^\s"$]+))\s*$"#
        ))
        .unwrap();
        let captures = line
            .captures(&self.text)
            .unwrap_or_else(|| self.changed(&format!("the setting {name}=value")));
        (1..=3)
            .find_map(|i| captures.get(i))
            .map(|m| m.as_str().to_owned())
            .unwrap()
    }

    /// The `echo` of `function`'s case branch for `key`:
    /// `function() { case "$1" in key) echo value ;; ... esac }`.
    pub(crate) fn case(&self, function: &str, key: &str) -> String {
        let header = format!("{function}() {{");
        let start = self
            .text
            .find(&header)
            .unwrap_or_else(|| self.changed(&format!("the function {function}")));
        let body = &self.text[start..];
        let body = &body[..body
            .find("esac")
            .unwrap_or_else(|| self.changed(&format!("the case statement of {function}")))];
        let branch = Regex::new(&format!(
            r"(?m)^\s*{}\)\s*echo\s+(\S+)\s*;;",
            regex::escape(key)
        ))
        .unwrap();
        branch
            .captures(body)
            .map(|c| c[1].to_owned())
            .unwrap_or_else(|| self.changed(&format!("`{key}) echo ...` in {function}")))
    }
}
