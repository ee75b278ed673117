//! Advantages: per group, from the rewards of the members that survived filtering, so an
//! evicted or filtered member never skews the baseline.
//!
//! * RLOO: `A_i = r_i - (sum(r) - r_i) / (n - 1)`; zeros when `n <= 1`.
//! * GRPO: `A_i = (r_i - mean(r)) / max(std(r), 1e-4)` with the population std, or
//!   `r_i - mean(r)` without the division; zeros when `n <= 1`.
//!
//! (Marin's formulas, `../shared/REFERENCES.md`.)

use crate::sync::Arc;
use std::fmt;

/// A custom advantage estimator.
pub trait AdvantageFn: Send + Sync + fmt::Debug {
    /// One advantage per reward, for one group.
    fn advantages(&self, rewards: &[f64]) -> Vec<f64>;
}

/// How advantages are computed from a group's rewards.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum Advantage {
    /// Leave-one-out baseline (RLOO).
    #[default]
    Rloo,
    /// Group-relative (GRPO): centred, and divided by the group's std when `divide_by_std`.
    Grpo {
        /// Divide by `max(std, 1e-4)` (Dr. GRPO turns this off).
        divide_by_std: bool,
    },
    /// The reward itself.
    None,
    /// A custom estimator.
    Custom(Arc<dyn AdvantageFn>),
}

/// The smallest std GRPO divides by.
const MIN_STD: f64 = 1e-4;

impl Advantage {
    /// One advantage per reward of one group.
    pub fn compute(&self, rewards: &[f64]) -> Vec<f64> {
        let n = rewards.len();
        match self {
            Advantage::None => rewards.to_vec(),
            Advantage::Custom(f) => f.advantages(rewards),
            _ if n <= 1 => vec![0.0; n],
            Advantage::Rloo => {
                let sum: f64 = rewards.iter().sum();
                let others = (n - 1) as f64;
                rewards.iter().map(|r| r - (sum - r) / others).collect()
            }
            Advantage::Grpo { divide_by_std } => {
                let (mean, std) = mean_std(rewards);
                let scale = if *divide_by_std {
                    std.max(MIN_STD)
                } else {
                    1.0
                };
                rewards.iter().map(|r| (r - mean) / scale).collect()
            }
        }
    }
}

/// Mean and population standard deviation (`0, 0` for no values).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn rloo_by_hand() {
        // r = [1, 0, 0, 1]: A_0 = 1 - (2 - 1) / 3 = 2/3; A_1 = 0 - 2/3 = -2/3.
        let a = Advantage::Rloo.compute(&[1.0, 0.0, 0.0, 1.0]);
        assert!(
            close(&a, &[2.0 / 3.0, -2.0 / 3.0, -2.0 / 3.0, 2.0 / 3.0]),
            "{a:?}"
        );
        // r = [3, 1]: A = [3 - 1, 1 - 3].
        assert!(close(&Advantage::Rloo.compute(&[3.0, 1.0]), &[2.0, -2.0]));
        assert!(close(&Advantage::Rloo.compute(&[5.0]), &[0.0]));
        assert!(Advantage::Rloo.compute(&[]).is_empty());
        assert!(close(&Advantage::Rloo.compute(&[2.0; 4]), &[0.0; 4]));
    }

    #[test]
    fn grpo_by_hand() {
        // r = [1, 2, 3, 4]: mean 2.5, population std sqrt(1.25).
        let s = 1.25f64.sqrt();
        let a = Advantage::Grpo {
            divide_by_std: true,
        }
        .compute(&[1.0, 2.0, 3.0, 4.0]);
        assert!(close(&a, &[-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]), "{a:?}");
        let a = Advantage::Grpo {
            divide_by_std: false,
        }
        .compute(&[1.0, 2.0, 3.0, 4.0]);
        assert!(close(&a, &[-1.5, -0.5, 0.5, 1.5]));
        // Equal rewards: zero advantages, no division by zero (std floored at 1e-4).
        let a = Advantage::Grpo {
            divide_by_std: true,
        }
        .compute(&[0.7; 3]);
        assert!(close(&a, &[0.0; 3]));
        // A tiny spread is divided by 1e-4, not by the tiny std.
        let a = Advantage::Grpo {
            divide_by_std: true,
        }
        .compute(&[0.0, 1e-6]);
        assert!(close(&a, &[-5e-7 / 1e-4, 5e-7 / 1e-4]), "{a:?}");
        assert!(close(
            &Advantage::Grpo {
                divide_by_std: true
            }
            .compute(&[9.0]),
            &[0.0]
        ));
    }

    #[test]
    fn none_and_custom() {
        assert!(close(&Advantage::None.compute(&[1.0, 2.0]), &[1.0, 2.0]));
        #[derive(Debug)]
        struct Double;
        impl AdvantageFn for Double {
            fn advantages(&self, rewards: &[f64]) -> Vec<f64> {
                rewards.iter().map(|r| 2.0 * r).collect()
            }
        }
        let a = Advantage::Custom(Arc::new(Double)).compute(&[1.0, 3.0]);
        assert!(close(&a, &[2.0, 6.0]));
    }
}
