//! When an overwrite has reached steady state: the rule, as a pure function
//! of the windows' write amplification.

use std::ops::Range;

/// Steady once `windows` successive eligible windows have write
/// amplifications within `tolerance` of each other (largest / smallest
/// - 1 at most `tolerance`).
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub windows: usize,
    pub tolerance: f64,
}

pub const RULE: Rule = Rule {
    windows: 3,
    tolerance: 0.05,
};

impl Rule {
    /// The first run of windows, all at or after `first_eligible`, that
    /// meets the rule; None if none does yet.
    pub fn steady(&self, was: &[f64], first_eligible: usize) -> Option<Range<usize>> {
        let n = self.windows.max(1);
        (first_eligible..was.len().saturating_sub(n - 1))
            .map(|start| start..start + n)
            .find(|r| {
                let w = &was[r.clone()];
                let lo = w.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                w.iter().all(|&x| x.is_finite() && x > 0.0) && hi <= lo * (1.0 + self.tolerance)
            })
    }

    /// The windows the steady figures are taken from: the steady run if
    /// there is one, else the last `windows` windows (fewer if there are).
    pub fn reported(&self, was: &[f64], first_eligible: usize) -> (bool, Range<usize>) {
        match self.steady(was, first_eligible) {
            Some(r) => (true, r),
            None => (false, was.len().saturating_sub(self.windows)..was.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_windows_within_five_percent_after_the_warm_up() {
        let was = [1.5, 2.4, 3.0, 3.1, 3.05, 3.12, 3.3];
        // Windows 2-4 agree (3.0 .. 3.1 is 3.3%), but only from window 3 on
        // do they count: 3-5 (3.05 .. 3.12, 2.3%).
        assert_eq!(RULE.steady(&was, 0), Some(2..5));
        assert_eq!(RULE.steady(&was, 3), Some(3..6));
        assert_eq!(RULE.reported(&was, 3), (true, 3..6));
    }

    #[test]
    fn a_drift_past_the_tolerance_is_not_steady() {
        // Each window 3% above the last: any three span 6.1%.
        let was: Vec<f64> = (0..10).map(|i| 2.0 * 1.03f64.powi(i)).collect();
        assert_eq!(RULE.steady(&was, 0), None);
        assert_eq!(RULE.reported(&was, 0), (false, 7..10));
        // Exactly 5% is within.
        assert_eq!(RULE.steady(&[2.0, 2.1, 2.05], 0), Some(0..3));
    }

    #[test]
    fn too_few_windows_or_none_eligible() {
        assert_eq!(RULE.steady(&[], 0), None);
        assert_eq!(RULE.steady(&[3.0, 3.0], 0), None);
        assert_eq!(RULE.steady(&[3.0, 3.0, 3.0], 1), None);
        assert_eq!(RULE.reported(&[3.0, 3.0], 5), (false, 0..2));
        assert_eq!(RULE.reported(&[], 0), (false, 0..0));
        // A window with nothing written (WA 0 or NaN) never counts.
        assert_eq!(RULE.steady(&[0.0, 0.0, 0.0], 0), None);
        assert_eq!(RULE.steady(&[f64::NAN, 1.0, 1.0, 1.0], 0), Some(1..4));
    }
}
