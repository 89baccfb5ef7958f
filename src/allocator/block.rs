//! `Block` and `BlockPool` (c10/cuda/CUDACachingAllocator.cpp), stored in an
//! arena: blocks are `u32` indices into one `Vec`, neighbours are indices, and
//! freed slots are reused, so malloc/free allocate nothing per event.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Index of a block in the arena.
pub type BlockId = u32;
/// "No block" (PyTorch's nullptr prev/next).
pub const NIL: BlockId = u32::MAX;

/// `Block`: a range of device memory inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

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
    #[inline]
    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id as usize]
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

/// `BlockPool`: the free (mapped) blocks ordered by (stream, size, address),
/// the unmapped expandable ranges ordered by (stream, address), and the GC clock.
#[derive(Debug, Clone, Default)]
pub struct BlockPool {
    pub blocks: BTreeMap<SizeKey, BlockId>,
    pub unmapped: BTreeMap<AddressKey, BlockId>,
    /// `get_free_blocks_call_count`.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    /// `BlockPool::insert_into_blocks`: also stamps the GC age base.
    #[inline]
    pub fn insert_into_blocks(&mut self, arena: &mut Arena, id: BlockId) {
        let b = arena.get_mut(id);
        b.gc_count_base = self.get_free_blocks_call_count;
        self.blocks.insert((b.stream, b.size, b.addr), id);
    }
    #[inline]
    pub fn erase_block(&mut self, b: &Block) -> bool {
        self.blocks.remove(&(b.stream, b.size, b.addr)).is_some()
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

/// A multiply-rotate hasher for addresses (the allocator's ptr → Block map is
/// hot; SipHash is several times slower and the keys are not adversarial).
#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // Addresses are 512-aligned: fold the high bits down so the table's low bits vary.
        self.0 ^ (self.0 >> 29)
    }
}

/// Address → block map.
pub type AddrMap = HashMap<u64, BlockId, BuildHasherDefault<AddrHasher>>;
