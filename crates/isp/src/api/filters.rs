// SPDX-License-Identifier: Apache-2.0
//! The `filters` query parameter of list and prune endpoints: JSON, either
//! `{"key": ["value", ...]}` or the older `{"key": {"value": true}}`. A key an endpoint
//! does not know is refused (400) rather than ignored, as Docker does.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Parsed filters: each key with its values.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Filters(BTreeMap<String, BTreeSet<String>>);

impl Filters {
    /// Parses the query parameter (absent or empty: no filters).
    pub fn parse(q: Option<&str>) -> Result<Filters, String> {
        let Some(q) = q.filter(|q| !q.trim().is_empty()) else { return Ok(Filters::default()) };
        let v: Value = serde_json::from_str(q).map_err(|e| format!("invalid filters {q:?}: {e}"))?;
        let Value::Object(m) = v else { return Err(format!("invalid filters {q:?}: a JSON object of lists")) };
        let mut out = BTreeMap::new();
        for (k, vals) in m {
            let set: BTreeSet<String> = match vals {
                Value::Array(a) => {
                    a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| format!("filter {k}: values are strings"))).collect::<Result<_, _>>()?
                }
                Value::Object(o) => o.into_iter().filter(|(_, b)| b.as_bool() == Some(true)).map(|(s, _)| s).collect(),
                Value::String(s) => [s].into(),
                _ => return Err(format!("filter {k}: a list of strings")),
            };
            out.insert(k, set);
        }
        Ok(Filters(out))
    }

    /// Refuses keys not in `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        match self.0.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(format!("invalid filter '{k}'")),
            None => Ok(()),
        }
    }

    /// The values of `key`.
    pub fn values(&self, key: &str) -> Vec<&str> {
        self.0.get(key).map(|s| s.iter().map(String::as_str).collect()).unwrap_or_default()
    }

    /// A boolean filter (`true`/`1`, `false`/`0`); `None` when absent.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        let v = self.values(key);
        match v.as_slice() {
            [] => Ok(None),
            [one] => match one.to_ascii_lowercase().as_str() {
                "true" | "1" => Ok(Some(true)),
                "false" | "0" => Ok(Some(false)),
                _ => Err(format!("invalid filter '{key}={one}': true or false")),
            },
            _ => Err(format!("invalid filter '{key}': give one value")),
        }
    }

    /// Whether `labels` satisfy every `key` value: `NAME` (present) or `NAME=VALUE`
    /// (present with that value); `label!` values must not hold.
    pub fn labels_match(&self, key: &str, labels: &BTreeMap<String, String>) -> bool {
        let holds = |want: &str| match want.split_once('=') {
            Some((k, v)) => labels.get(k).is_some_and(|x| x == v),
            None => labels.contains_key(want),
        };
        self.values(key).iter().all(|w| holds(w)) && self.values(&format!("{key}!")).iter().all(|w| !holds(w))
    }
}

/// Whether a `reference` filter (`busybox`, `busybox:1.*`, `reg:5000/x`) matches a tag
/// (`NAME:TAG`): by glob over the whole tag, or over its name alone.
pub fn reference_matches(pattern: &str, tag: &str) -> bool {
    let name = tag.rsplit_once(':').filter(|(_, t)| !t.contains('/')).map_or(tag, |(n, _)| n);
    glob(pattern, tag) || glob(pattern, name) || name.rsplit('/').next().is_some_and(|short| glob(pattern, short) && !pattern.contains('/'))
}

/// `*` (no `/`), `?`, and literal characters.
fn glob(p: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (p.chars().collect(), s.chars().collect());
    fn go(p: &[char], s: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some('*') => (0..=s.len()).take_while(|&i| i == 0 || s[i - 1] != '/').any(|i| go(&p[1..], &s[i..])),
            Some('?') => !s.is_empty() && s[0] != '/' && go(&p[1..], &s[1..]),
            Some(c) => s.first() == Some(c) && go(&p[1..], &s[1..]),
        }
    }
    go(&p, &s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_parse_and_unknown_keys_are_refused() {
        let f = Filters::parse(Some(r#"{"label":["a=1","b"],"dangling":{"true":true}}"#)).unwrap();
        assert_eq!(f.values("label"), ["a=1", "b"]);
        assert_eq!(f.bool("dangling"), Ok(Some(true)));
        assert!(f.only(&["label"]).unwrap_err().contains("dangling"));
        assert!(Filters::parse(Some("{")).is_err());
        assert!(Filters::parse(Some("[1]")).is_err());
        assert_eq!(Filters::parse(None).unwrap(), Filters::default());
        let labels: BTreeMap<String, String> = [("a".to_string(), "1".to_string()), ("b".into(), "x".into())].into();
        assert!(f.labels_match("label", &labels));
        assert!(!Filters::parse(Some(r#"{"label":["a=2"]}"#)).unwrap().labels_match("label", &labels));
    }

    #[test]
    fn references_match_by_glob() {
        assert!(reference_matches("busybox", "busybox:latest"));
        assert!(reference_matches("busybox:lat*", "busybox:latest"));
        assert!(reference_matches("127.0.0.1:5000/busybox", "127.0.0.1:5000/busybox:latest"));
        assert!(reference_matches("busybox", "127.0.0.1:5000/busybox:latest"));
        assert!(!reference_matches("alpine", "busybox:latest"));
        assert!(!reference_matches("*", "a/b:c") || reference_matches("*", "b:c"));
    }

    proptest::proptest! {
        #[test]
        fn random_filters_never_panic(s in ".{0,80}", p in "[a-z*?:/]{0,12}", t in "[a-z:/]{0,12}") {
            let _ = Filters::parse(Some(&s)).map(|f| (f.bool("dangling"), f.only(&["x"])));
            let _ = reference_matches(&p, &t);
        }
    }
}
