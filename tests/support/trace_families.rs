//! Trace families for judging text-only answers against replays: six shapes
//! of real GPU workloads, generated from a seed (no committed data). They are
//! written independently of the probe generators of
//! `allocdoc::workload::probe` (other sizes, lifetimes, epochs, randomness),
//! so that an evaluation on them does not grade the probes on their own
//! homework.

use allocdoc::workload::Event;
use allocdoc::workload::probe::Builder;

/// xorshift64*, seeded; deterministic on every machine.
pub struct Rng(u64);

impl Rng {
    /// Seeded through splitmix64, so that neighbouring seeds start far apart.
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFamily {
    VariableLengthTraining,
    KvCacheInference,
    InterleavedLifetimes,
    SmallAndHuge,
    PeriodicEmptyCache,
    PinnedMidSize,
}

impl TraceFamily {
    pub const ALL: [TraceFamily; 6] = [
        TraceFamily::VariableLengthTraining,
        TraceFamily::KvCacheInference,
        TraceFamily::InterleavedLifetimes,
        TraceFamily::SmallAndHuge,
        TraceFamily::PeriodicEmptyCache,
        TraceFamily::PinnedMidSize,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TraceFamily::VariableLengthTraining => "variable-length training",
            TraceFamily::KvCacheInference => "KV-cache inference",
            TraceFamily::InterleavedLifetimes => "interleaved short/long-lived",
            TraceFamily::SmallAndHuge => "small tensors + a few huge",
            TraceFamily::PeriodicEmptyCache => "periodic empty_cache",
            TraceFamily::PinnedMidSize => "pinned 11-19 MiB tensors",
        }
    }

    /// The family's events for `seed`.
    pub fn generate(self, seed: u64) -> Vec<Event> {
        let mut g = Gen {
            b: Builder::default(),
            rng: Rng::new(seed ^ (self as u64) << 32),
        };
        match self {
            TraceFamily::VariableLengthTraining => g.variable_length_training(),
            TraceFamily::KvCacheInference => g.kv_cache_inference(),
            TraceFamily::InterleavedLifetimes => g.interleaved_lifetimes(),
            TraceFamily::SmallAndHuge => g.small_and_huge(),
            TraceFamily::PeriodicEmptyCache => g.periodic_empty_cache(),
            TraceFamily::PinnedMidSize => g.pinned_mid_size(),
        }
        g.b.events
    }
}

/// The events (written through the probes' [`Builder`]) and the seeded choices.
struct Gen {
    b: Builder,
    rng: Rng,
}

impl std::ops::Deref for Gen {
    type Target = Builder;
    fn deref(&self) -> &Builder {
        &self.b
    }
}

impl std::ops::DerefMut for Gen {
    fn deref_mut(&mut self) -> &mut Builder {
        &mut self.b
    }
}

impl Gen {
    /// A transformer trained on sequences of varying length: weights and
    /// optimizer state first, per step activations kept for the backward
    /// pass (sized by the sequence length), a temporary per layer,
    /// gradients allocated at the first backward and kept.
    fn variable_length_training(&mut self) {
        let hidden = [1024, 2048, 3072][self.rng.range(0, 2) as usize] as u64;
        let layers = self.rng.range(6, 14);
        let weight = hidden * hidden * 4 * 2;
        for _ in 0..layers {
            self.alloc(weight);
        }
        let mut grads: Vec<u32> = Vec::new();
        let steps = self.rng.range(25, 45);
        let batch = self.rng.range(1, 4);
        for _ in 0..steps {
            let len = self.rng.range(2, 32) * 128;
            let act = len * hidden * 2 * batch;
            let mut saved = Vec::new();
            for _ in 0..layers {
                saved.push(self.alloc(act));
                let scores = self.alloc(len * len / 8 * batch);
                let tmp = self.alloc(act * 2);
                self.free(tmp);
                saved.push(scores);
            }
            let logits = self.alloc(len * batch * 32_000 * 2 / 4);
            self.free(logits);
            for _ in 0..layers {
                let g = self.alloc(act * 2);
                let scores = saved.pop().expect("saved");
                let a = saved.pop().expect("saved");
                self.free(scores);
                self.free(a);
                self.free(g);
            }
            if grads.is_empty() {
                grads = (0..layers).map(|_| self.alloc(weight)).collect();
            }
        }
    }

    /// LLM serving: weights, then decode steps over concurrent requests whose
    /// KV buffers grow by reallocation (alloc the larger, free the old), a
    /// prefill temporary when a request arrives, logits per step.
    fn kv_cache_inference(&mut self) {
        let per_token = [64, 128, 256][self.rng.range(0, 2) as usize] as u64 * KIB;
        let chunk = self.rng.range(8, 64);
        for _ in 0..self.rng.range(4, 10) {
            let w = self.rng.range(64, 512) * MIB;
            self.alloc(w);
        }
        let max_live = self.rng.range(4, 16) as usize;
        // (id, tokens allocated, tokens used, tokens to generate)
        let mut live: Vec<(u32, u64, u64, u64)> = Vec::new();
        for _ in 0..self.rng.range(250, 500) {
            if live.len() < max_live && self.rng.chance(0.3) {
                let prompt = self.rng.range(64, 2048);
                let prefill = self.alloc(prompt * per_token * 4);
                let cap = prompt.div_ceil(chunk) * chunk;
                let kv = self.alloc(cap * per_token);
                self.free(prefill);
                live.push((kv, cap, prompt, self.rng.range(32, 1024)));
            }
            let logits = self.alloc(live.len().max(1) as u64 * 128 * KIB);
            let mut i = 0;
            while i < live.len() {
                let (id, cap, used, left) = live[i];
                if left == 0 {
                    self.free(id);
                    live.swap_remove(i);
                    continue;
                }
                if used + 1 > cap {
                    let grown = self.alloc((cap + chunk) * per_token);
                    self.free(id);
                    live[i] = (grown, cap + chunk, used + 1, left - 1);
                } else {
                    live[i] = (id, cap, used + 1, left - 1);
                }
                i += 1;
            }
            self.free(logits);
        }
    }

    /// A stream of tensors of mixed sizes, most freed almost at once, some
    /// living for hundreds of allocations.
    fn interleaved_lifetimes(&mut self) {
        let p_long = 0.15 + 0.25 * self.rng.unit();
        let scale = self.rng.range(1, 4) * MIB;
        // (id, allocations left to live)
        let mut live: Vec<(u32, u32)> = Vec::new();
        for _ in 0..self.rng.range(1500, 2500) {
            let size = match self.rng.range(0, 9) {
                0..=5 => self.rng.range(1, 8) * scale,
                6..=8 => self.rng.range(8, 24) * scale,
                _ => self.rng.range(24, 64) * scale,
            };
            let life = if self.rng.chance(p_long) {
                self.rng.range(100, 600) as u32
            } else {
                self.rng.range(0, 4) as u32
            };
            let id = self.alloc(size);
            live.push((id, life));
            let mut i = 0;
            while i < live.len() {
                if live[i].1 == 0 {
                    let (id, _) = live.swap_remove(i);
                    self.free(id);
                } else {
                    live[i].1 -= 1;
                    i += 1;
                }
            }
        }
    }

    /// Thousands of small tensors (4 KiB–1 MiB, short and medium lives) and,
    /// now and then, a huge one (0.25–2 GiB) held for a few steps; a few
    /// huge ones stay.
    fn small_and_huge(&mut self) {
        let mut small: Vec<(u32, u32)> = Vec::new();
        let mut huge: Vec<(u32, u32)> = Vec::new();
        let huge_every = self.rng.range(20, 60);
        for step in 0..self.rng.range(300, 600) {
            for _ in 0..self.rng.range(4, 16) {
                let id = {
                    let size = self.rng.range(4, 1024) * KIB;
                    self.alloc(size)
                };
                small.push((id, self.rng.range(0, 40) as u32));
            }
            if step % huge_every == 0 {
                let id = {
                    let size = self.rng.range(256, 2048) * MIB;
                    self.alloc(size)
                };
                let life = if self.rng.chance(0.2) {
                    u32::MAX
                } else {
                    self.rng.range(1, 30) as u32
                };
                huge.push((id, life));
            }
            if self.rng.chance(0.3) {
                let id = {
                    let size = self.rng.range(2, 60) * MIB;
                    self.alloc(size)
                };
                small.push((id, self.rng.range(0, 10) as u32));
            }
            for set in [&mut small, &mut huge] {
                let mut i = 0;
                while i < set.len() {
                    if set[i].1 == 0 {
                        let (id, _) = set.swap_remove(i);
                        self.events.push(Event::Free { id });
                    } else {
                        set[i].1 = set[i].1.saturating_sub(1);
                        i += 1;
                    }
                }
            }
        }
    }

    /// Steps of batches of varying size, `empty_cache()` every few steps, and
    /// a slowly growing set of long-lived tensors (metrics, cached features).
    fn periodic_empty_cache(&mut self) {
        let unit = self.rng.range(2, 12) * MIB;
        let every = self.rng.range(3, 12);
        let keep_p = 0.05 + 0.15 * self.rng.unit();
        for step in 0..self.rng.range(150, 300) {
            let batch = self.rng.range(1, 16);
            let input = self.alloc(unit * batch);
            let h1 = self.alloc(unit * batch * 3);
            let h2 = self.alloc(unit * batch * 2);
            self.free(h1);
            let out = self.alloc(unit * batch / 2);
            self.free(input);
            self.free(h2);
            if self.rng.chance(keep_p) {
                {
                    let size = self.rng.range(1, 8) * unit / 2;
                    self.alloc(size)
                };
            }
            self.free(out);
            if step % every == every - 1 {
                self.events.push(Event::EmptyCache);
            }
        }
    }

    /// Rounds of 11–19 MiB tensors of which some stay (pinned between the
    /// freed ones), then larger requests that need the holes merged.
    fn pinned_mid_size(&mut self) {
        let keep_p = 0.3 + 0.3 * self.rng.unit();
        for _ in 0..self.rng.range(12, 30) {
            let mut round = Vec::new();
            for _ in 0..self.rng.range(10, 30) {
                let size = self.rng.range(11 * 4, 19 * 4) * MIB / 4;
                round.push(self.alloc(size));
            }
            for id in round {
                if !self.rng.chance(keep_p) {
                    self.free(id);
                }
            }
            for _ in 0..self.rng.range(2, 8) {
                let big = {
                    let size = self.rng.range(20, 96) * MIB;
                    self.alloc(size)
                };
                if self.rng.chance(0.8) {
                    self.free(big);
                }
            }
        }
    }
}
