//! The seeded generator behind warpline's reproducible random inputs: the fuzzer
//! ([`crate::fuzz`]) and the `warpline stress` run derive every random choice from one printed
//! `u64` seed through it, so the same seed replays the same run.
//!
//! splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
//! 2014; the constants of Vigna's reference `splitmix64.c`) over a 64-bit state: deterministic,
//! fast, not cryptographic. [`StdRng`]'s methods follow `rand`'s names, so code written against
//! `rand` reads the same; it is not `rand`'s `StdRng` (whose stream is not fixed across versions).

/// splitmix64: a well-mixed 64-bit value from any input.
pub fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A generator for one part of a run (`part`, `index`), derived from the run's `seed`: parts
/// draw independent streams, so adding draws to one part leaves the others' inputs unchanged.
pub fn rng_for(seed: u64, part: u64, index: u64) -> StdRng {
    StdRng::seed_from_u64(mix64(seed ^ mix64(part ^ mix64(index))))
}

/// The fuzzer's and the stress run's random generator: splitmix64 over a 64-bit state
/// (deterministic per seed; not cryptographic). Its methods follow `rand`'s names so the
/// generators read the same.
#[derive(Clone, Debug)]
pub struct StdRng {
    state: u64,
}

/// Integers [`StdRng::random_range`] draws.
pub trait RangeInt: Copy {
    /// The value as a `u64` (unsigned types only, so never negative).
    fn to_u64(self) -> u64;
    /// `v` as this type; `v` is in range for every value [`StdRng::random_range`] passes.
    fn from_u64(v: u64) -> Self;
}
macro_rules! range_int {
    ($($t:ty),*) => {$(
        impl RangeInt for $t {
            fn to_u64(self) -> u64 {
                self as u64
            }
            fn from_u64(v: u64) -> Self {
                v as $t
            }
        }
    )*};
}
range_int!(u8, u16, u32, u64, usize);

/// `lo..hi` and `lo..=hi` as the start and the inclusive end (`None` when empty).
pub trait IntRange<T> {
    /// The range's start and its inclusive end, `None` for an empty range.
    fn inclusive(self) -> (u64, Option<u64>);
}
impl<T: RangeInt> IntRange<T> for std::ops::Range<T> {
    fn inclusive(self) -> (u64, Option<u64>) {
        let (lo, hi) = (self.start.to_u64(), self.end.to_u64());
        (lo, (lo < hi).then(|| hi - 1))
    }
}
impl<T: RangeInt> IntRange<T> for std::ops::RangeInclusive<T> {
    fn inclusive(self) -> (u64, Option<u64>) {
        let (lo, hi) = (self.start().to_u64(), self.end().to_u64());
        (lo, (lo <= hi).then_some(hi))
    }
}

impl StdRng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn seed_from_u64(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits (splitmix64: add the golden-ratio increment, then mix).
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        // `mix64` adds the increment itself: undo it so this is exactly splitmix64.
        mix64(self.state.wrapping_sub(0x9E37_79B9_7F4A_7C15))
    }

    /// 32 random bits.
    pub fn random(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A value in `range` (nearly uniform: multiply-shift, bias below 2^-32 for the small spans
    /// used here). An empty range gives its start (never panics).
    pub fn random_range<T: RangeInt>(&mut self, range: impl IntRange<T>) -> T {
        let (lo, hi) = range.inclusive();
        let Some(hi) = hi else {
            return T::from_u64(lo);
        };
        let span = (hi - lo).wrapping_add(1);
        let v = if span == 0 {
            self.next_u64()
        } else {
            lo + ((self.next_u64() as u128 * span as u128) >> 64) as u64
        };
        T::from_u64(v)
    }

    /// `true` with probability `p` (clamped to [0, 1]).
    pub fn random_bool(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64) < p.clamp(0.0, 1.0) * (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_generator_stays_in_range_and_is_deterministic() {
        let mut a = StdRng::seed_from_u64(42);
        let mut b = StdRng::seed_from_u64(42);
        // The first splitmix64 output for seed 0 is the reference value 0xE220A8397B1DCDAF.
        assert_eq!(StdRng::seed_from_u64(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            let x: usize = a.random_range(1..=4);
            assert_eq!(x, b.random_range(1..=4usize));
            seen[x - 1] = true;
            let y: u64 = a.random_range(0..3u64);
            assert!(y < 3);
            b.random_range(0..3u64);
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(a.random_range(5..5u32), 5);
        assert_eq!(
            a.random_range(u64::MIN..=u64::MAX),
            b.random_range(0..=u64::MAX)
        );
        assert!(!a.random_bool(0.0) && a.random_bool(1.0));
    }
}
