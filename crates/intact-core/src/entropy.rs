//! The IsRand test of Oprea–Reiter §3.3 and §5.2 (after Oprea, Reiter and Yang, NDSS 2005):
//! a block is *random-looking* when the empirical entropy of its byte frequencies exceeds a
//! threshold chosen by experiment.
//!
//! RAND-EINT accepts a block whose decryption is **not** random-looking without any other
//! check. Its security therefore rests on one number per block size: the probability that
//! a uniformly random block (what HCTR2 yields when a ciphertext, tweak or counter is
//! wrong) is classified *not* random. [`forgery_log2_bound`] computes a rigorous upper
//! bound on it, and [`threshold`] is chosen so that this bound is at most 2^-[`SECURITY_BITS`]
//! while classifying ordinary text, code and binaries as not random (the calibration is in
//! docs/design.md, "IsRand", and `examples/entropy_calibrate.rs`).

/// The per-forgery security target: a random block passes as authentic with probability
/// at most 2^-SECURITY_BITS (an *online* bound: every failed attempt is a tamper alarm).
pub const SECURITY_BITS: f64 = 64.0;

/// Shannon entropy, in bits per byte, of the byte frequencies of `block`.
pub fn byte_entropy(block: &[u8]) -> f64 {
    if block.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in block {
        counts[b as usize] += 1;
    }
    let n = block.len() as f64;
    // H = log2 n - (1/n) Σ c log2 c
    let s: f64 = counts
        .iter()
        .filter(|&&c| c > 1)
        .map(|&c| {
            let c = f64::from(c);
            c * c.log2()
        })
        .sum();
    n.log2() - s / n
}

/// The IsRand threshold, in bits per byte, for blocks of `bs` bytes: a block is
/// random-looking when its byte entropy is **above** it.
///
/// For each power-of-two size it is the largest multiple of 1/16 bit whose
/// [`forgery_log2_bound`] is at most 2^-[`SECURITY_BITS`] (`examples/entropy_calibrate.rs
/// bounds` recomputes the column). A higher threshold only means that fewer genuine blocks
/// need a tree leaf; the bound, not the calibration on real files, limits it. Other lengths
/// use the threshold of the next smaller power of two (a longer block with a lower threshold
/// has a smaller bound); blocks under 128 bytes are always random-looking. The values are
/// frozen by a test: changing them changes which blocks get a tree leaf, hence the format.
pub fn threshold(bs: usize) -> f64 {
    match bs {
        0..=127 => f64::NEG_INFINITY,
        128..=255 => 5.6875,
        256..=511 => 6.5625,
        512..=1023 => 7.1875,
        1024..=2047 => 7.5625,
        2048..=4095 => 7.75,
        4096..=8191 => 7.875,
        _ => 7.9375,
    }
}

/// IsRand(B) (§3.3): 1 when `block` looks uniformly random, i.e. its byte entropy exceeds
/// [`threshold`] for its length.
pub fn is_rand(block: &[u8]) -> bool {
    byte_entropy(block) > threshold(block.len())
}

/// log2 of an upper bound on Pr[byte_entropy(U) ≤ t] for U uniform on n-byte strings: the
/// probability that a random block is accepted as authentic by RAND-EINT.
///
/// Method (Poissonization + Chernoff): let c_1..c_256 be i.i.d. Poisson(λ = n/256); the
/// byte counts of U are their law conditioned on Σc = n. The event is
/// Σ g(c_k) ≥ T with g(c) = c ln c and T = n ln n − n t ln 2. On Σc = n it equals
/// Σ (g(c_k) − a c_k) ≥ T − a n for any a, and every c_k ≤ n, so
///
///   Pr ≤ e^{−θ(T − a n)} · (Σ_{c=0}^{n} e^{θ(g(c) − a c)} Pois_λ(c))^256 / Pois_n(n)
///
/// for every θ ≥ 0; we minimise over θ ∈ [0, 1) and a near g'(λ) = ln λ + 1 (which removes
/// the first-order term, leaving the χ²-like fluctuation the conditioning really allows).
pub fn forgery_log2_bound(n: usize, t_bits: f64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let nf = n as f64;
    let lambda = nf / 256.0;
    let t_nats = t_bits * std::f64::consts::LN_2;
    let big_t = nf * nf.ln() - nf * t_nats;
    // ln Pois_n(n) = -n + n ln n - ln n!
    let ln_fact = |c: usize| -> f64 { (2..=c).map(|k| (k as f64).ln()).sum() };
    let ln_pois_nn = -nf + nf * nf.ln() - ln_fact(n);
    // Terms beyond `cmax` are negligible for θ < 1 (they decay super-exponentially).
    let cmax = n.min((lambda + 60.0 * lambda.sqrt() + 200.0) as usize);
    let mut lnf = vec![0.0f64; cmax + 1];
    for c in 2..=cmax {
        lnf[c] = lnf[c - 1] + (c as f64).ln();
    }
    let eval = |theta: f64, a: f64| -> f64 {
        // ln M = logsumexp_c [θ(g(c) − a c) + c ln λ − λ − ln c!]
        let mut terms = Vec::with_capacity(cmax + 1);
        for (c, lf) in lnf.iter().enumerate() {
            let cf = c as f64;
            let g = if c > 1 { cf * cf.ln() } else { 0.0 };
            terms.push(theta * (g - a * cf) + cf * lambda.ln() - lambda - lf);
        }
        let mx = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let ln_m = mx + terms.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
        -theta * (big_t - a * nf) + 256.0 * ln_m - ln_pois_nn
    };
    let a0 = lambda.ln() + 1.0;
    let mut best = 0.0f64;
    for step in -20..=20 {
        let a = a0 + f64::from(step) * 0.1;
        let (mut lo, mut hi) = (0.0f64, 0.999f64);
        for _ in 0..60 {
            let m1 = lo + (hi - lo) / 3.0;
            let m2 = hi - (hi - lo) / 3.0;
            if eval(m1, a) < eval(m2, a) {
                hi = m2;
            } else {
                lo = m1;
            }
        }
        best = best.min(eval((lo + hi) / 2.0, a));
    }
    best / std::f64::consts::LN_2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_of_known_blocks() {
        assert_eq!(byte_entropy(&[0u8; 4096]), 0.0);
        let all: Vec<u8> = (0..=255u8).collect();
        assert!((byte_entropy(&all) - 8.0).abs() < 1e-12);
        let two: Vec<u8> = (0..4096).map(|i| (i % 2) as u8).collect();
        assert!((byte_entropy(&two) - 1.0).abs() < 1e-12);
        let mut r = vec![0u8; 4096];
        crate::crypto::fill_random(&mut r);
        assert!(is_rand(&r));
        assert!(!is_rand(
            b"The quick brown fox jumps over the lazy dog. "
                .repeat(91)
                .as_slice()
        ));
    }

    /// "Random-looking" means strictly above the threshold. Blocks built with counts that
    /// are powers of two have an entropy that floating point computes exactly:
    /// 128 bytes with 21 values four times and 44 once have 7 - 168/128 = 5.6875 bits (the
    /// threshold for 128); 4,096 bytes with 32 values 32 times, 160 values 16 times and 64
    /// values 8 times have 12 - 16896/4096 = 7.875 bits (the threshold for 4,096).
    #[test]
    fn a_block_exactly_at_the_threshold_is_not_random() {
        let block = |counts: &[(usize, usize)]| -> Vec<u8> {
            let mut out = Vec::new();
            let mut value = 0u8;
            for &(values, times) in counts {
                for _ in 0..values {
                    out.extend(std::iter::repeat_n(value, times));
                    value = value.wrapping_add(1);
                }
            }
            out
        };
        let b128 = block(&[(21, 4), (44, 1)]);
        assert_eq!(b128.len(), 128);
        assert_eq!(byte_entropy(&b128), threshold(128));
        assert!(!is_rand(&b128));
        let b4096 = block(&[(32, 32), (160, 16), (64, 8)]);
        assert_eq!(b4096.len(), 4096);
        assert_eq!(byte_entropy(&b4096), threshold(4096));
        assert!(!is_rand(&b4096));
        // One step above: a value seen 4 times split into two seen twice.
        let above = block(&[(20, 4), (2, 2), (44, 1)]);
        assert!(byte_entropy(&above) > threshold(128));
        assert!(is_rand(&above));
    }

    /// The thresholds meet the security target at every supported block size, and are the
    /// largest that do (in 1/16-bit steps).
    #[test]
    fn thresholds_meet_security_target() {
        for bs in [128usize, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536] {
            let t = threshold(bs);
            let b = forgery_log2_bound(bs, t);
            assert!(b <= -SECURITY_BITS, "bs {bs}: t {t} gives 2^{b}");
            let b2 = forgery_log2_bound(bs, t + 0.0625);
            assert!(
                b2 > -SECURITY_BITS,
                "bs {bs}: t {t} could be higher (2^{b2})"
            );
        }
        assert_eq!(threshold(100), f64::NEG_INFINITY);
        assert_eq!(threshold(3000), threshold(2048));
    }

    /// The bound at each threshold up to 1,024 bytes, frozen to a thousandth of a bit (the
    /// same method summed over every count up to n, in Python, gives the same values: the
    /// terms this code leaves out past `cmax` do not move it).
    #[test]
    fn bounds_at_the_thresholds_are_frozen() {
        for (bs, want) in [
            (128, -67.8986),
            (256, -66.0585),
            (512, -66.8235),
            (1024, -80.1366),
        ] {
            let got = forgery_log2_bound(bs, threshold(bs));
            assert!((got - want).abs() < 1e-3, "bs {bs}: 2^{got}, want 2^{want}");
        }
    }

    /// The bound is a bound: it is never below the frequency observed by sampling.
    #[test]
    fn bound_is_above_sampled_frequency() {
        // 128-byte uniform blocks: mean entropy about 6.7 bits; count those at or below 6.5.
        let trials = 20_000;
        let mut hits = 0;
        let mut r = vec![0u8; 128];
        for _ in 0..trials {
            crate::crypto::fill_random(&mut r);
            if byte_entropy(&r) <= 6.5 {
                hits += 1;
            }
        }
        let freq = f64::from(hits) / f64::from(trials);
        let bound = forgery_log2_bound(128, 6.5).exp2();
        assert!(
            freq > 0.001,
            "the sample must hit the event to test anything ({freq})"
        );
        assert!(bound >= freq * 0.8, "bound {bound} below frequency {freq}");
        assert!(forgery_log2_bound(4096, 7.9) < forgery_log2_bound(4096, 7.95));
    }
}
