//! A small block-style YAML writer for `serde_json::Value`, enough to print CRDs readably.
//! Strings that could be read back as anything but themselves are written JSON-quoted (a JSON
//! string is a valid YAML double-quoted scalar), so the output always parses to the same value.

use serde_json::Value;
use std::fmt::Write;

/// `---`-less YAML for one document, ending with a newline.
pub fn to_yaml<T: serde::Serialize>(v: &T) -> String {
    let v = serde_json::to_value(v).unwrap_or(Value::Null);
    let mut out = String::new();
    match &v {
        Value::Object(m) if !m.is_empty() => map(m, 0, &mut out),
        Value::Array(a) if !a.is_empty() => seq(a, 0, &mut out),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

fn pad(n: usize, out: &mut String) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn map(m: &serde_json::Map<String, Value>, indent: usize, out: &mut String) {
    let mut first = true;
    for (k, v) in m {
        if !first {
            pad(indent, out);
        }
        first = false;
        out.push_str(&string(k));
        out.push(':');
        entry(v, indent, out);
    }
}

/// After `key:` or `-`: the value inline or as a nested block.
fn entry(v: &Value, indent: usize, out: &mut String) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            pad(indent + 2, out);
            map(m, indent + 2, out);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            pad(indent, out);
            seq(a, indent, out);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn seq(a: &[Value], indent: usize, out: &mut String) {
    let mut first = true;
    for v in a {
        if !first {
            pad(indent, out);
        }
        first = false;
        out.push('-');
        match v {
            Value::Object(m) if !m.is_empty() => {
                out.push(' ');
                map(m, indent + 2, out);
            }
            Value::Array(inner) if is_block(v) => {
                out.push(' ');
                seq(inner, indent + 2, out);
            }
            other => {
                out.push(' ');
                out.push_str(&scalar(other));
                out.push('\n');
            }
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
    }
}

/// Plain when unambiguous, else JSON-quoted.
fn string(s: &str) -> String {
    const RESERVED: &[&str] = &[
        "true", "false", "null", "yes", "no", "on", "off", "y", "n", "~",
    ];
    let plain = !s.is_empty()
        && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && !RESERVED.contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_owned()
    } else {
        let mut q = String::new();
        let _ = write!(q, "{}", Value::String(s.to_owned()));
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_nested_blocks() {
        let v = serde_json::json!({
            "a": {"b": [1, {"c": "x y", "d": []}, [true, "yes"]], "e": {}},
            "f": "plain-str.ing/ok", "g": null, "h": "1.0"
        });
        let y = to_yaml(&v);
        assert_eq!(
            y,
            "a:\n  b:\n  - 1\n  - c: \"x y\"\n    d: []\n  - - true\n    - \"yes\"\n  e: {}\nf: plain-str.ing/ok\ng: null\nh: \"1.0\"\n"
        );
    }
}
