//! The JSON envelope of every `--json` report: `schema` (the report and its version, such as
//! `repro.diff.v1`), `verdict` where the command decides something, then the report's own
//! fields (docs/diff.md, "JSON").

use serde::Serialize;

#[derive(Serialize)]
struct Document<'a, T: Serialize> {
    schema: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<&'a str>,
    #[serde(flatten)]
    report: &'a T,
}

/// `report` as a pretty-printed JSON document under `schema`, with `verdict` when given.
pub fn document(schema: &str, verdict: Option<&str>, report: &impl Serialize) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&Document { schema, verdict, report })
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize)]
    struct Report {
        steps: u64,
    }

    #[test]
    fn the_schema_and_verdict_come_first_then_the_report_s_fields() {
        let text = super::document("repro.test.v1", Some("identical"), &Report { steps: 3 }).unwrap();
        assert_eq!(text, "{\n  \"schema\": \"repro.test.v1\",\n  \"verdict\": \"identical\",\n  \"steps\": 3\n}");
        let text = super::document("repro.test.v1", None, &Report { steps: 3 }).unwrap();
        assert!(!text.contains("verdict"), "{text}");
    }
}
