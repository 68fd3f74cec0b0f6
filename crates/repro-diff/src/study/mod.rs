//! What multi-run studies compute from finished runs, with no model code: the statistics over
//! runs ([`stats`]) and the reports they fill ([`results`]). The runners that train the runs live
//! in the `repro` crate.

pub mod results;
pub mod stats;
pub mod subgroups;

use serde::{Deserialize, Deserializer};

/// JSON has no NaN: serde_json writes a non-finite number as `null`. A study's JSON files read
/// it back as NaN, so a run whose training diverged stays readable (and resumable).
pub(crate) fn nan_from_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// `nan_from_null` for every element of a list.
pub(crate) fn nans_from_nulls<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Ok(Vec::<Option<f64>>::deserialize(d)?.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect())
}
