//! The statistics every workload suite reports: the median, min and max of
//! a quantity over repeated runs ([`Spread`]), and the geometric mean that
//! summarises ratios over workloads ([`geomean`]). Both read back from JSON
//! results, where NaN is written as null.

use serde::{Deserialize, Serialize};

/// Median, min and max of one quantity over the runs.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Spread {
    #[serde(deserialize_with = "nan_if_null")]
    pub median: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub min: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub max: f64,
}

/// JSON has no NaN: serde_json writes it as null, so null reads back as NaN.
pub fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl Spread {
    /// No values: every bound NaN (a quantity an older result file lacks).
    pub fn none() -> Spread {
        Spread::of(&[])
    }

    pub fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        Spread {
            median: crate::timing::median(values),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    /// Each bound divided by `base` (a ratio to plain's median).
    pub fn over(self, base: f64) -> Spread {
        Spread {
            median: self.median / base,
            min: self.min / base,
            max: self.max / base,
        }
    }
}

/// Geometric mean of the positive, finite values; NaN if there are none.
pub fn geomean(values: &[f64]) -> f64 {
    let good: Vec<f64> = values
        .iter()
        .copied()
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    if good.is_empty() {
        return f64::NAN;
    }
    (good.iter().map(|v| v.ln()).sum::<f64>() / good.len() as f64).exp()
}
