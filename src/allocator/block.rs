//! `Block` and `BlockPool` (c10/cuda/CUDACachingAllocator.cpp), stored in an
//! arena: blocks are `u32` indices into one `Vec`, neighbours are indices, and
//! freed slots are reused, so malloc/free allocate nothing per event.

use std::collections::BTreeMap;

/// Index of a block in the arena.
pub type BlockId = u32;
/// "No block" (PyTorch's nullptr prev/next).
pub const NIL: BlockId = u32::MAX;

/// `Block`: a range of device memory inside a segment. Aligned to a cache line
/// (it is 62 bytes), so touching a block costs one line, not two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(align(64))]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    /// The unrounded size of the last allocation (stale once free).
    pub requested_size: u64,
    pub stream: u64,
    pub prev: BlockId,
    pub next: BlockId,
    /// `gc_count_base`: the pool's `get_free_blocks_call_count` when inserted.
    pub gc_count_base: u64,
    /// Outstanding stream events before the deferred free completes.
    pub event_count: u32,
    /// Expandable segment index, or [`NIL`] for a cudaMalloc'd segment.
    pub expandable: u32,
    pub small: bool,
    pub allocated: bool,
    pub mapped: bool,
    /// `!stream_uses.empty()` (the streams themselves live beside the arena).
    pub has_stream_uses: bool,
    /// The slot holds a block (false for recycled slots).
    pub live: bool,
    /// Allocated and held by the caller ([`super::CachingAllocator::malloc_block`]),
    /// not entered in the address map.
    pub held: bool,
}

// One cache line: a field more would make every block two.
const _: () = assert!(size_of::<Block>() == 64);

impl Block {
    pub fn new(addr: u64, size: u64, stream: u64, small: bool) -> Self {
        Block {
            addr,
            size,
            requested_size: 0,
            stream,
            prev: NIL,
            next: NIL,
            gc_count_base: 0,
            event_count: 0,
            expandable: NIL,
            small,
            allocated: false,
            mapped: true,
            has_stream_uses: false,
            live: true,
            held: false,
        }
    }
    /// `Block::is_split`.
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
    #[inline]
    pub fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }
}

/// The block arena with a free list of slots.
#[derive(Debug, Clone, Default)]
pub struct Arena {
    blocks: Vec<Block>,
    free_slots: Vec<BlockId>,
}

impl Arena {
    pub fn insert(&mut self, block: Block) -> BlockId {
        if let Some(id) = self.free_slots.pop() {
            self.blocks[id as usize] = block;
            id
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as BlockId
        }
    }
    /// `delete block`.
    pub fn remove(&mut self, id: BlockId) {
        self.blocks[id as usize].live = false;
        self.free_slots.push(id);
    }
    #[inline]
    pub fn get(&self, id: BlockId) -> &Block {
        &self.blocks[id as usize]
    }
    /// The slot `id`, if the arena has it (live or recycled).
    #[inline]
    pub fn try_get(&self, id: BlockId) -> Option<&Block> {
        self.blocks.get(id as usize)
    }
    #[inline]
    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id as usize]
    }
    /// Slots, live or recycled.
    pub fn slots(&self) -> usize {
        self.blocks.len()
    }
    /// Every live block.
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live)
            .map(|(i, b)| (i as BlockId, b))
    }
}

/// Key of the free set: `BlockComparatorSize` = (stream, size, address).
pub type SizeKey = (u64, u64, u64);
/// Key of the unmapped set: `BlockComparatorAddress` = (stream, address).
pub type AddressKey = (u64, u64);

/// Sub-buckets per octave of sizes, as a power of two.
const SUB_BITS: usize = 5;
/// Size buckets per stream: `2 << SUB_BITS` exact classes of 512 bytes, then
/// `1 << SUB_BITS` per octave (sizes within a bucket differ by at most ~3 %).
const BUCKETS: usize = (2 << SUB_BITS) + (55 - SUB_BITS) * (1 << SUB_BITS);
const BITMAP_WORDS: usize = BUCKETS.div_ceil(64);

/// The bucket of `size`; monotone in `size`, so bucket order is size order.
#[inline]
fn bucket(size: u64) -> usize {
    let units = size >> 9;
    if units < (2 << SUB_BITS) {
        return units as usize;
    }
    let octave = 63 - units.leading_zeros() as usize;
    let sub = ((units >> (octave - SUB_BITS)) & ((1 << SUB_BITS) - 1)) as usize;
    (2 << SUB_BITS) + (octave - SUB_BITS - 1) * (1 << SUB_BITS) + sub
}

/// A free block in its bucket: 24 bytes (a `u128` key would align entries to
/// 32), so inserts and removes move less memory.
#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    addr: u64,
    id: BlockId,
}

impl Entry {
    #[inline]
    fn is(&self, size: u64, addr: u64) -> bool {
        self.size == size && self.addr == addr
    }
    #[inline]
    fn below(&self, size: u64, addr: u64) -> bool {
        // One 128-bit compare: no branch on `size ==` inside the binary search.
        (u128::from(self.size) << 64 | u128::from(self.addr))
            < (u128::from(size) << 64 | u128::from(addr))
    }
}

/// One stream's free blocks: per bucket, (size, address, block) kept sorted,
/// and a bitmap of the non-empty buckets.
#[derive(Debug, Clone)]
struct StreamFree {
    stream: u64,
    /// Entries sorted by (size, address).
    buckets: Vec<Vec<Entry>>,
    nonempty: [u64; BITMAP_WORDS],
}

impl StreamFree {
    fn new(stream: u64) -> Self {
        StreamFree {
            stream,
            buckets: vec![Vec::new(); BUCKETS],
            nonempty: [0; BITMAP_WORDS],
        }
    }
    /// The first non-empty bucket at or after `from`.
    fn next_bucket(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        if word >= BITMAP_WORDS {
            return None;
        }
        let mut bits = self.nonempty[word] & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word >= BITMAP_WORDS {
                return None;
            }
            bits = self.nonempty[word];
        }
    }
    /// The last non-empty bucket strictly before `before`.
    fn prev_bucket(&self, before: usize) -> Option<usize> {
        if before == 0 {
            return None;
        }
        let last = before - 1;
        let mut word = last / 64;
        let mut bits = self.nonempty[word] & (u64::MAX >> (63 - last % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + 63 - bits.leading_zeros() as usize);
            }
            if word == 0 {
                return None;
            }
            word -= 1;
            bits = self.nonempty[word];
        }
    }
    /// Position of the first entry not below (size, addr).
    fn lower_bound(&self, size: u64, addr: u64) -> (usize, usize) {
        let b = bucket(size);
        if !self.is_nonempty(b) {
            // The bitmap is in L1; an empty bucket's entries need not be touched.
            return (b, 0);
        }
        let i = self.buckets[b].partition_point(|e| e.below(size, addr));
        (b, i)
    }
    #[inline]
    fn is_nonempty(&self, b: usize) -> bool {
        self.nonempty[b / 64] & (1 << (b % 64)) != 0
    }
    /// The (stream, size, address) key and block at position (b, i).
    #[inline]
    fn entry(&self, b: usize, i: usize) -> (SizeKey, BlockId) {
        let e = self.buckets[b][i];
        ((self.stream, e.size, e.addr), e.id)
    }
    /// The position after (b, i): the next entry in its bucket, else the first
    /// of the next non-empty bucket.
    #[inline]
    fn after(&self, b: usize, i: usize) -> Option<(usize, usize)> {
        if self.buckets.get(b).is_some_and(|v| i + 1 < v.len()) {
            return Some((b, i + 1));
        }
        self.next_bucket(b + 1).map(|b| (b, 0))
    }
}

/// A position in a [`FreeSet`] (what a `std::set` iterator is to PyTorch):
/// valid until the set changes.
#[derive(Debug, Clone, Copy)]
pub struct Cursor {
    stream: usize,
    bucket: usize,
    index: usize,
}

/// The ordered free set of a pool (`BlockPool::blocks`): what a
/// `std::set<Block*, BlockComparatorSize>` gives PyTorch — lower_bound on
/// (stream, size, address), in-order and reverse walks — with sorted buckets
/// per stream instead of a tree, for speed.
#[derive(Debug, Clone, Default)]
pub struct FreeSet {
    streams: Vec<StreamFree>,
    len: usize,
}

impl FreeSet {
    /// Bytes a copy of the set holds, about: the bucket tables and entries.
    pub fn approx_bytes(&self) -> usize {
        self.streams.len() * (BUCKETS * size_of::<Vec<Entry>>() + BITMAP_WORDS * 8)
            + self.len * size_of::<Entry>()
    }
    fn stream(&self, stream: u64) -> Option<&StreamFree> {
        self.streams.iter().find(|s| s.stream == stream)
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn insert(&mut self, (stream, size, addr): SizeKey, id: BlockId) {
        let index = match self.streams.iter().position(|s| s.stream == stream) {
            Some(i) => i,
            None => {
                let at = self.streams.partition_point(|s| s.stream < stream);
                self.streams.insert(at, StreamFree::new(stream));
                at
            }
        };
        let sf = &mut self.streams[index];
        let (b, i) = sf.lower_bound(size, addr);
        let v = &mut sf.buckets[b];
        if let Some(e) = v.get_mut(i)
            && e.is(size, addr)
        {
            e.id = id;
            return;
        }
        v.insert(i, Entry { size, addr, id });
        sf.nonempty[b / 64] |= 1 << (b % 64);
        self.len += 1;
    }
    pub fn remove(&mut self, key: &SizeKey) -> bool {
        let Some(at) = self.find(key) else {
            return false;
        };
        self.remove_at(at);
        true
    }
    /// The position of `key`, if it is in the set.
    #[inline]
    fn find(&self, &(stream, size, addr): &SizeKey) -> Option<Cursor> {
        let index = self.streams.iter().position(|s| s.stream == stream)?;
        let (b, i) = self.streams[index].lower_bound(size, addr);
        self.streams[index].buckets[b]
            .get(i)
            .is_some_and(|e| e.is(size, addr))
            .then_some(Cursor {
                stream: index,
                bucket: b,
                index: i,
            })
    }
    /// Removes the entry at `at` (`blocks.erase(it)`), with no second search.
    pub fn remove_at(&mut self, at: Cursor) {
        let sf = &mut self.streams[at.stream];
        let v = &mut sf.buckets[at.bucket];
        if at.index + 1 == v.len() {
            // Most buckets hold one block: no call to move nothing.
            v.pop();
        } else {
            v.remove(at.index);
        }
        if v.is_empty() {
            // The stream's buckets stay allocated: streams are few, and a pool that
            // empties and refills (one segment reused over and over) must not pay
            // for them again.
            sf.nonempty[at.bucket / 64] &= !(1 << (at.bucket % 64));
        }
        self.len -= 1;
    }
    /// The first block of `stream` with size >= `size` (`lower_bound({stream, size})`).
    #[inline]
    pub fn lower_bound(&self, stream: u64, size: u64) -> Option<Cursor> {
        let index = self.streams.iter().position(|s| s.stream == stream)?;
        let sf = &self.streams[index];
        let (b, i) = sf.lower_bound(size, 0);
        let (bucket, index_in) = if sf.is_nonempty(b) && i < sf.buckets[b].len() {
            (b, i)
        } else {
            (sf.next_bucket(b + 1)?, 0)
        };
        Some(Cursor {
            stream: index,
            bucket,
            index: index_in,
        })
    }
    /// The next block of the same stream (`++it` while the stream matches).
    #[inline]
    pub fn next(&self, at: Cursor) -> Option<Cursor> {
        let (bucket, index) = self.streams[at.stream].after(at.bucket, at.index)?;
        Some(Cursor {
            stream: at.stream,
            bucket,
            index,
        })
    }
    /// The key and block at `at`.
    #[inline]
    pub fn get(&self, at: Cursor) -> (SizeKey, BlockId) {
        self.streams[at.stream].entry(at.bucket, at.index)
    }
    /// The blocks of `stream` from the first with size >= `size` upwards
    /// (`lower_bound({stream, size})` and the iterator walking on).
    pub fn range_from(&self, stream: u64, size: u64) -> impl Iterator<Item = (SizeKey, BlockId)> {
        std::iter::successors(self.lower_bound(stream, size), |&at| self.next(at))
            .map(|at| self.get(at))
    }
    /// The blocks of `stream` with size < `size`, largest first (walking back
    /// from `lower_bound({stream, size})`).
    pub fn range_below(&self, stream: u64, size: u64) -> impl Iterator<Item = (SizeKey, BlockId)> {
        let sf = self.stream(stream);
        let step_back = |sf: &StreamFree, b: usize, i: usize| -> Option<(usize, usize)> {
            if i > 0 {
                return Some((b, i - 1));
            }
            sf.prev_bucket(b).map(|b| (b, sf.buckets[b].len() - 1))
        };
        let mut pos = sf.and_then(|sf| {
            let (b, i) = sf.lower_bound(size, 0);
            step_back(sf, b, i)
        });
        std::iter::from_fn(move || {
            let sf = sf?;
            let (b, i) = pos?;
            pos = step_back(sf, b, i);
            Some(sf.entry(b, i))
        })
    }
    /// Every block in (stream, size, address) order.
    pub fn iter(&self) -> impl Iterator<Item = (SizeKey, BlockId)> + '_ {
        self.streams.iter().flat_map(|sf| {
            // Only the non-empty buckets, from the bitmap: a pool holds a few
            // blocks among 1 664 buckets, and `release_blocks` walks it on every
            // retry after a failed cudaMalloc.
            std::iter::successors(sf.next_bucket(0), |&b| sf.next_bucket(b + 1))
                .flat_map(move |b| sf.buckets[b].iter())
                .map(move |e| ((sf.stream, e.size, e.addr), e.id))
        })
    }
    /// Every block id in order.
    pub fn values(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.iter().map(|(_, id)| id)
    }
}

/// `BlockPool`: the free (mapped) blocks ordered by (stream, size, address),
/// the unmapped expandable ranges ordered by (stream, address), and the GC clock.
#[derive(Debug, Clone, Default)]
pub struct BlockPool {
    pub blocks: FreeSet,
    pub unmapped: BTreeMap<AddressKey, BlockId>,
    /// `get_free_blocks_call_count`.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    /// `BlockPool::insert_into_blocks`: also stamps the GC age base.
    #[inline]
    pub fn insert_into_blocks(&mut self, arena: &mut Arena, id: BlockId) {
        let b = arena.get(id);
        self.insert_into_blocks_as(arena, id, (b.stream, b.size, b.addr));
    }
    /// [`Self::insert_into_blocks`] with the block's key as the caller has it
    /// at hand: after writing a block's address and size, reading them back
    /// at once waits on those stores (a 16-byte load cannot be forwarded from
    /// two 8-byte stores), which cost a tenth of `malloc`'s time.
    #[inline]
    pub fn insert_into_blocks_as(&mut self, arena: &mut Arena, id: BlockId, key: SizeKey) {
        let b = arena.get_mut(id);
        debug_assert_eq!(key, (b.stream, b.size, b.addr));
        b.gc_count_base = self.get_free_blocks_call_count;
        self.blocks.insert(key, id);
    }
    #[inline]
    pub fn erase_block(&mut self, b: &Block) -> bool {
        self.blocks.remove(&(b.stream, b.size, b.addr))
    }
    #[inline]
    pub fn insert_unmapped(&mut self, b: &Block, id: BlockId) {
        self.unmapped.insert((b.stream, b.addr), id);
    }
    #[inline]
    pub fn erase_unmapped(&mut self, b: &Block) -> bool {
        self.unmapped.remove(&(b.stream, b.addr)).is_some()
    }
    /// `Block::gc_count()`.
    #[inline]
    pub fn gc_count(&self, b: &Block) -> u64 {
        self.get_free_blocks_call_count - b.gc_count_base
    }
}

/// `allocated_blocks` (ptr → Block): an open-addressing table with linear
/// probing and backward-shift deletion. Addresses are 512-aligned and never
/// `u64::MAX`, which marks an empty slot. It is on every malloc and free, where
/// it runs about twice as fast as a general-purpose hash map.
#[derive(Debug, Clone)]
pub struct AddrMap {
    slots: Vec<(u64, BlockId)>,
    len: usize,
}

const EMPTY: u64 = u64::MAX;

impl Default for AddrMap {
    fn default() -> Self {
        AddrMap {
            slots: vec![(EMPTY, NIL); 64],
            len: 0,
        }
    }
}

impl AddrMap {
    #[inline]
    fn home(&self, addr: u64) -> usize {
        let bits = self.slots.len().trailing_zeros();
        ((addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    /// The slot holding `addr`, or the empty slot where it would go.
    #[inline]
    fn find(&self, addr: u64) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        loop {
            let key = self.slots[i].0;
            if key == addr || key == EMPTY {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, addr: &u64) -> Option<&BlockId> {
        let i = self.find(*addr);
        (self.slots[i].0 == *addr).then(|| &self.slots[i].1)
    }

    /// Inserts or replaces; returns the previous block at `addr`.
    pub fn insert(&mut self, addr: u64, id: BlockId) -> Option<BlockId> {
        debug_assert_ne!(addr, EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            let grown = vec![(EMPTY, NIL); self.slots.len() * 2];
            let old = std::mem::replace(&mut self.slots, grown);
            for (key, value) in old.into_iter().filter(|s| s.0 != EMPTY) {
                let i = self.find(key);
                self.slots[i] = (key, value);
            }
        }
        let i = self.find(addr);
        let previous = (self.slots[i].0 == addr).then_some(self.slots[i].1);
        if previous.is_none() {
            self.len += 1;
        }
        self.slots[i] = (addr, id);
        previous
    }

    pub fn remove(&mut self, addr: &u64) -> Option<BlockId> {
        let mask = self.slots.len() - 1;
        let mut hole = self.find(*addr);
        if self.slots[hole].0 != *addr {
            return None;
        }
        let removed = self.slots[hole].1;
        self.len -= 1;
        // Backward shift: pull later entries of the probe run into the hole
        // unless their home lies cyclically in (hole, j].
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let key = self.slots[j].0;
            if key == EMPTY {
                break;
            }
            let home = self.home(key);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = (EMPTY, NIL);
        Some(removed)
    }

    /// Every (address, block), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &BlockId)> {
        self.slots
            .iter()
            .filter(|s| s.0 != EMPTY)
            .map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn buckets_are_monotone_in_size() {
        let mut last = 0;
        for size in (512..(1u64 << 34)).step_by(1 << 23).chain([u64::MAX]) {
            let b = bucket(size);
            assert!(b >= last && b < BUCKETS);
            last = b;
        }
    }

    proptest! {
        /// The address map behaves like a HashMap under inserts and removes.
        #[test]
        fn addr_map_matches_a_hash_map(ops in prop::collection::vec((0u64..200, any::<bool>()), 1..600)) {
            let mut map = AddrMap::default();
            let mut model = std::collections::HashMap::new();
            for (i, (slot, insert)) in ops.into_iter().enumerate() {
                let addr = 0x7f00_0000_0000 + slot * 512;
                if insert {
                    prop_assert_eq!(map.insert(addr, i as BlockId), model.insert(addr, i as BlockId));
                } else {
                    prop_assert_eq!(map.remove(&addr), model.remove(&addr));
                }
                prop_assert_eq!(map.len(), model.len());
            }
            for (addr, id) in &model {
                prop_assert_eq!(map.get(addr), Some(id));
            }
            prop_assert_eq!(map.iter().count(), model.len());
        }

        /// The free set answers like the `std::set` it replaces (a BTreeMap here).
        #[test]
        fn free_set_matches_an_ordered_map(
            ops in prop::collection::vec((0u64..3, prop_oneof![1u64..40, 1u64..(1 << 24)], 0u64..8, any::<bool>()), 1..300),
            probes in prop::collection::vec((0u64..3, prop_oneof![1u64..40, 1u64..(1 << 24)]), 1..20),
        ) {
            let mut set = FreeSet::default();
            let mut model: BTreeMap<SizeKey, BlockId> = BTreeMap::new();
            for (i, (stream, units, addr, insert)) in ops.into_iter().enumerate() {
                let key = (stream, units * 512, addr << 30);
                if insert {
                    set.insert(key, i as BlockId);
                    model.insert(key, i as BlockId);
                } else {
                    prop_assert_eq!(set.remove(&key), model.remove(&key).is_some());
                }
            }
            prop_assert_eq!(set.len(), model.len());
            let all: Vec<_> = model.iter().map(|(k, &v)| (*k, v)).collect();
            prop_assert_eq!(set.iter().collect::<Vec<_>>(), all);
            for (stream, units) in probes {
                let size = units * 512;
                let up: Vec<_> = model
                    .range((stream, size, 0)..)
                    .take_while(|(k, _)| k.0 == stream)
                    .map(|(k, &v)| (*k, v))
                    .collect();
                prop_assert_eq!(set.range_from(stream, size).collect::<Vec<_>>(), up);
                let down: Vec<_> = model
                    .range(..(stream, size, 0))
                    .rev()
                    .take_while(|(k, _)| k.0 == stream)
                    .map(|(k, &v)| (*k, v))
                    .collect();
                prop_assert_eq!(set.range_below(stream, size).collect::<Vec<_>>(), down);
            }
        }
    }
}
