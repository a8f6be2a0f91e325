//! Zipf-distributed ranks by rejection-inversion (Hörmann and Derflinger,
//! "Rejection-inversion to generate variates from monotone discrete
//! distributions", 1996): O(1) per draw for any number of ranks, no table.
//!
//! Rank k in 1..=n has probability k^-θ / Σ j^-θ. Each rank k owns an
//! interval of length h(k) = k^-θ on the axis of H, the integral of
//! h(x) = x^-θ; a uniform point on the union of those intervals picks k.
//! The proposal draws u uniformly in [H(1.5) - 1, H(n + 0.5)], inverts H and
//! rounds to the nearest rank k; since h is convex, the slice of H's axis
//! that rounds to k, [H(k - 0.5), H(k + 0.5)], holds k's interval
//! [H(k + 0.5) - h(k), H(k + 0.5)] (rank 1's interval is the proposal's
//! start, [H(1.5) - 1, H(1.5)]), so accepting u only there gives each rank
//! exactly its share. At least about 80% of proposals are accepted.

use super::pattern::Rng;

#[derive(Debug, Clone)]
pub struct Zipf {
    n: u64,
    theta: f64,
    /// H(1.5) - h(1): where the proposal interval starts.
    low: f64,
    /// H(n + 0.5): where it ends.
    high: f64,
}

impl Zipf {
    /// Ranks 1..=n with exponent `theta` (> 0; 1 is allowed).
    pub fn new(n: u64, theta: f64) -> Zipf {
        let n = n.max(1);
        let mut z = Zipf {
            n,
            theta,
            low: 0.0,
            high: 0.0,
        };
        z.low = z.big_h(1.5) - 1.0;
        z.high = z.big_h(n as f64 + 0.5);
        z
    }

    /// A rank in 1..=n.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.low + rng.unit() * (self.high - self.low);
            let x = self.big_h_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n as f64);
            if u >= self.big_h(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// h(x) = x^-θ.
    fn h(&self, x: f64) -> f64 {
        (-self.theta * x.ln()).exp()
    }

    /// H(x) = (x^(1-θ) - 1) / (1-θ), or ln x when θ = 1: written as
    /// ln x · (e^t - 1)/t with t = (1-θ) ln x, which stays exact near θ = 1.
    fn big_h(&self, x: f64) -> f64 {
        let ln_x = x.ln();
        expm1_over_x((1.0 - self.theta) * ln_x) * ln_x
    }

    /// The inverse of H: (1 + (1-θ)y)^(1/(1-θ)), or e^y when θ = 1.
    fn big_h_inverse(&self, y: f64) -> f64 {
        let t = (y * (1.0 - self.theta)).max(-1.0);
        (ln1p_over_x(t) * y).exp()
    }
}

/// (e^x - 1) / x, continuous at 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x / 2.0 + x * x / 6.0
    }
}

/// ln(1 + x) / x, continuous at 0.
fn ln1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x / 2.0 + x * x / 3.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Observed share of the first ranks against k^-θ / Σ j^-θ.
    fn check(n: u64, theta: f64) {
        let z = Zipf::new(n, theta);
        let mut rng = Rng::new(7);
        let draws = 1_000_000u64;
        let mut counts = [0u64; 21];
        for _ in 0..draws {
            let k = z.sample(&mut rng);
            assert!((1..=n).contains(&k), "rank {k} outside 1..={n}");
            if k <= 20 {
                counts[k as usize] += 1;
            }
        }
        let norm: f64 = (1..=n).map(|j| (j as f64).powf(-theta)).sum();
        for (k, &c) in counts.iter().enumerate().skip(1) {
            let expect = (k as f64).powf(-theta) / norm;
            let seen = c as f64 / draws as f64;
            // Five standard deviations of a binomial share, plus 1% of it.
            let sd = (expect * (1.0 - expect) / draws as f64).sqrt();
            assert!(
                (seen - expect).abs() <= 5.0 * sd + 0.01 * expect,
                "n {n} θ {theta} rank {k}: {seen:.5} drawn, {expect:.5} expected"
            );
        }
    }

    #[test]
    fn rank_frequencies_match_zipfs_law() {
        check(1_000, 0.9);
        check(1_000_000, 0.99);
        check(100_000, 1.0);
        check(50, 1.5);
    }

    #[test]
    fn one_rank_is_always_rank_one() {
        let z = Zipf::new(1, 0.99);
        let mut rng = Rng::new(1);
        assert!((0..1000).all(|_| z.sample(&mut rng) == 1));
    }

    #[test]
    fn every_rank_is_drawn_when_they_are_few() {
        let z = Zipf::new(8, 0.99);
        let mut rng = Rng::new(3);
        let mut seen = [false; 9];
        for _ in 0..10_000 {
            seen[z.sample(&mut rng) as usize] = true;
        }
        assert!(seen[1..].iter().all(|&s| s), "{seen:?}");
    }
}
