//! How metrics that may not be finite are written in JSON. JSON has no NaN or infinity, and
//! serde_json writes both as `null`, which loses which one it was. Here a finite value is a
//! number, and the others are the strings `"nan"`, `"inf"` and `"-inf"` (docs/diff.md, JSON).

use serde::Serializer;

fn name(x: f64) -> &'static str {
    if x.is_nan() {
        "nan"
    } else if x > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// An `f64` field.
pub(crate) fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else {
        s.serialize_str(name(*x))
    }
}

/// An `Option<f64>` field (`None` stays `null`).
pub(crate) fn option<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => serialize(x, s),
        None => s.serialize_none(),
    }
}

/// A list of (step, value) points, the value `null` where absent.
pub(crate) fn points<S: Serializer>(points: &[(u64, Option<f64>)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    struct Point(u64, Option<f64>);
    impl serde::Serialize for Point {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeTuple;
            let mut t = s.serialize_tuple(2)?;
            t.serialize_element(&self.0)?;
            t.serialize_element(&self.1.map(Float))?;
            t.end()
        }
    }
    let mut seq = s.serialize_seq(Some(points.len()))?;
    for &(step, value) in points {
        seq.serialize_element(&Point(step, value))?;
    }
    seq.end()
}

/// A matrix of `f64`.
pub(crate) fn matrix<S: Serializer>(rows: &[Vec<f64>], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    struct Row<'a>(&'a [f64]);
    impl serde::Serialize for Row<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(self.0.len()))?;
            for x in self.0 {
                seq.serialize_element(&Float(*x))?;
            }
            seq.end()
        }
    }
    let mut seq = s.serialize_seq(Some(rows.len()))?;
    for row in rows {
        seq.serialize_element(&Row(row))?;
    }
    seq.end()
}

struct Float(f64);

impl serde::Serialize for Float {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize(&self.0, s)
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize)]
    struct Sample {
        #[serde(serialize_with = "super::serialize")]
        x: f64,
        #[serde(serialize_with = "super::option")]
        y: Option<f64>,
        #[serde(serialize_with = "super::matrix")]
        m: Vec<Vec<f64>>,
    }

    #[test]
    fn non_finite_values_are_named_and_finite_ones_stay_numbers() {
        let json = |x, y| {
            serde_json::to_string(&Sample { x, y, m: vec![vec![0.5, f64::NAN], vec![f64::NEG_INFINITY, 0.0]] }).unwrap()
        };
        assert_eq!(json(f64::INFINITY, Some(f64::NAN)), r#"{"x":"inf","y":"nan","m":[[0.5,"nan"],["-inf",0.0]]}"#);
        assert_eq!(json(1.5, None), r#"{"x":1.5,"y":null,"m":[[0.5,"nan"],["-inf",0.0]]}"#);
    }
}
