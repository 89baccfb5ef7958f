//! The sizes of a trace's live allocations by address, for the allocated
//! peak alone (`parse`'s evidence, [`super::attribute::Attributor::peak_only`]).
//!
//! A trace of a million allocations that live to its end keeps a million
//! addresses, tens of MB of table, and each lookup is a cache miss. This is
//! an open-addressing table of 16-byte slots (address, size; linear probing,
//! backward-shift deletion), sized once for the trace and faulted in before
//! its first use, so a lookup costs one cache line (and a page walk: on 2 MiB
//! pages it would not, but one run of `parse` in six then stalled for up to
//! 0.7 s, BENCHMARKS.md, issue 33); [`LiveMap::touch`]
//! lets the caller look up a window of addresses before it changes them, so
//! their misses overlap instead of waiting on each other.

use super::grow::populate_all;

/// Address → size; the address 0 marks an empty slot (and is kept aside).
pub struct LiveMap {
    slots: Vec<[u64; 2]>,
    /// `slots.len() - 1` (a power of two); 0 before the first insert.
    mask: usize,
    len: usize,
    /// The size at address 0.
    zero: Option<u64>,
}

/// Fibonacci hashing: the product's high bits, so block addresses (which
/// differ in their middle bits) spread over the table.
#[inline(always)]
fn home(addr: u64, mask: usize) -> usize {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask
}

impl LiveMap {
    /// Room for `live` addresses at once before the table grows (it holds
    /// twice that many slots).
    pub fn with_room(live: usize) -> Self {
        let mut m = LiveMap {
            slots: Vec::new(),
            mask: 0,
            len: 0,
            zero: None,
        };
        m.grow_to(live.saturating_mul(2).max(64).next_power_of_two());
        m
    }

    fn grow_to(&mut self, slots: usize) {
        let mut table = vec![[0u64; 2]; slots];
        // Written before read: no zero page mapped, then copied (see populate_all).
        populate_all(&mut table);
        let old = std::mem::replace(&mut self.slots, table);
        self.mask = slots - 1;
        self.len = 0;
        for [addr, size] in old {
            if addr != 0 {
                self.insert(addr, size);
            }
        }
    }

    /// Reads the slot `addr` would start its probe at, changing nothing
    /// (the caller keeps the value to keep the load).
    #[inline(always)]
    pub fn touch(&self, addr: u64) -> u64 {
        self.slots.get(home(addr, self.mask)).map_or(0, |s| s[0])
    }

    /// Sets `addr`'s size, giving the size it had.
    pub fn insert(&mut self, addr: u64, size: u64) -> Option<u64> {
        if addr == 0 {
            return self.zero.replace(size);
        }
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow_to(self.slots.len() * 2);
        }
        let mut i = home(addr, self.mask);
        loop {
            let slot = &mut self.slots[i];
            if slot[0] == addr {
                return Some(std::mem::replace(&mut slot[1], size));
            }
            if slot[0] == 0 {
                *slot = [addr, size];
                self.len += 1;
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes `addr`, giving its size.
    pub fn remove(&mut self, addr: u64) -> Option<u64> {
        if addr == 0 {
            return self.zero.take();
        }
        let mut i = home(addr, self.mask);
        loop {
            let slot = *self.slots.get(i)?;
            if slot[0] == 0 {
                return None;
            }
            if slot[0] == addr {
                break;
            }
            i = (i + 1) & self.mask;
        }
        let size = self.slots[i][1];
        // Backward shift: each later entry of the run moves into the hole
        // unless its home lies after the hole (cyclically), so every entry
        // stays reachable from its home without tombstones.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let addr = self.slots[j][0];
            if addr == 0 {
                break;
            }
            let h = home(addr, self.mask);
            if (j.wrapping_sub(h) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = [0, 0];
        self.len -= 1;
        Some(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_live_map_answers_as_a_hash_map_does() {
        // Addresses from a few dense ranges (blocks of segments), 0 and the
        // largest, inserted, replaced and removed at random; the table starts
        // small, so it grows several times.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut map = LiveMap::with_room(4);
        let mut want: HashMap<u64, u64> = HashMap::new();
        for step in 0..400_000u64 {
            let r = next();
            let addr = match r % 10 {
                0 => 0,
                1 => u64::MAX,
                2..=5 => 0x7f00_0000_0000 + (r >> 8) % 4096 * 512,
                _ => 0x7e00_0000_0000 + (r >> 8) % 100_000 * 512,
            };
            if step % 3 == 0 {
                assert_eq!(map.remove(addr), want.remove(&addr), "step {step}");
            } else {
                assert_eq!(
                    map.insert(addr, step),
                    want.insert(addr, step),
                    "step {step}"
                );
            }
        }
        for (&addr, &size) in &want {
            assert_eq!(map.remove(addr), Some(size));
        }
        assert_eq!(map.len, 0);
        assert!(map.slots.iter().all(|s| s[0] == 0));
    }
}
