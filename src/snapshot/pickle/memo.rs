//! The memo: how PUT, BINPUT, MEMOIZE store values and GET, BINGET read
//! them back, kept as runs of arena ids while picklers memoize objects in
//! creation order, and dense once a file breaks that pattern.

use super::V;
use super::decoder::Decoder;
use super::error::{DecodeError, Fail, Res};
use std::collections::HashMap;

/// Marks a dense memo entry as an index into [`Memo::values`] (arena ids
/// stay below 2^29).
const MEMO_VALUE: u32 = 1 << 31;

/// Runs kept before the memo turns dense (a binary search over them takes
/// at most 10 steps).
const MAX_MEMO_RUNS: usize = 1024;

/// The memo. Picklers memoize objects as they create them, so memo index i
/// is nearly always arena object i + k, with k changing only after an
/// object that is not memoized (a float, an empty tuple). Such runs are kept
/// as their first index and first id and read by arithmetic: no memory per
/// entry and no cache miss per BINGET. An entry that breaks the pattern (an
/// overwrite, a memoized int, too many runs) turns the memo dense.
#[derive(Default)]
pub(super) struct Memo {
    /// Entries `0..len` are stored (in `runs` or `dense`).
    pub(super) len: u64,
    /// `(first index, first arena id)`, ascending; used while `dense` is empty.
    runs: Vec<(u64, u32)>,
    /// The first [`EARLY`] entries while in runs (emptied when the memo
    /// turns dense), read without a run search: the dict keys, memoized
    /// first, and the frames the first steps share with later ones (grown as
    /// entries come, so a small pickle pays nothing).
    early: Vec<V>,
    /// One entry per index: an arena id, or an index into `values` with
    /// [`MEMO_VALUE`] set.
    dense: Vec<u32>,
    values: Vec<V>,
    /// Indices stored out of order (past `len`), so a huge declared index
    /// cannot size an allocation.
    sparse: HashMap<u64, V>,
}

/// Why the memo could not take an entry.
#[derive(Debug)]
pub(super) enum MemoFull {
    /// Its table of non-object values is full (the limit).
    Values(u64),
    /// The system refused this many more bytes.
    Memory(usize),
}

/// Memo entries kept in [`Memo::early`] (512 KiB at most). A run search
/// is a chain of dependent loads; on a trace of 1 M entries, the load that
/// ends it drew 18 % of `run_releasing`'s samples (BENCHMARKS.md, "top
/// against Mosaic").
const EARLY: usize = 1 << 16;

impl Memo {
    #[inline(always)]
    pub(super) fn put(&mut self, idx: u64, v: V) -> Result<(), MemoFull> {
        if idx > self.len {
            self.sparse
                .try_reserve(1)
                .map_err(|_| MemoFull::Memory(size_of::<(u64, V)>()))?;
            self.sparse.insert(idx, v);
            return Ok(());
        }
        if idx == self.len
            && self.dense.is_empty()
            && let Some(id) = v.id()
        {
            let follows = self.runs.last().is_some_and(|&(first, first_id)| {
                u64::from(first_id) + (idx - first) == u64::from(id)
            });
            if !follows {
                if self.runs.len() == MAX_MEMO_RUNS {
                    return self.densify_then_put(idx, v);
                }
                self.runs.push((idx, id));
            }
            if self.early.len() < EARLY {
                // `early` holds entries `0..len` while it is not full.
                self.early.push(v);
            }
            self.len += 1;
            return Ok(());
        }
        self.densify_then_put(idx, v)
    }

    #[cold]
    fn densify_then_put(&mut self, idx: u64, v: V) -> Result<(), MemoFull> {
        let refused = |more: usize| MemoFull::Memory(more * size_of::<u32>());
        if self.dense.is_empty() {
            self.early = Vec::new();
            let all = self.len as usize + 1;
            self.dense.try_reserve(all).map_err(|_| refused(all))?;
            for (i, &(first, id)) in self.runs.iter().enumerate() {
                let end = self.runs.get(i + 1).map_or(self.len, |r| r.0);
                self.dense.extend((0..end - first).map(|j| id + j as u32));
            }
            self.runs.clear();
        }
        let entry = match v.id() {
            Some(id) => id,
            None => {
                let i = u32::try_from(self.values.len())
                    .ok()
                    .filter(|&i| i < MEMO_VALUE)
                    .ok_or(MemoFull::Values(u64::from(MEMO_VALUE)))?;
                self.values.try_reserve(1).map_err(|_| refused(2))?;
                self.values.push(v);
                i | MEMO_VALUE
            }
        };
        if idx < self.len {
            self.dense[idx as usize] = entry;
        } else {
            self.dense.try_reserve(1).map_err(|_| refused(1))?;
            self.dense.push(entry);
            self.len += 1;
        }
        Ok(())
    }

    #[inline(always)]
    pub(super) fn get(&self, idx: u64) -> Option<V> {
        // `early` holds entries below `len` only, and is emptied when the memo turns dense.
        if let Some(&v) = self.early.get(idx as usize) {
            return Some(v);
        }
        if idx >= self.len {
            return self.sparse.get(&idx).copied();
        }
        if self.dense.is_empty() {
            let k = self.runs.partition_point(|r| r.0 <= idx).checked_sub(1)?;
            let (first, id) = self.runs[k];
            return Some(V::object(id + (idx - first) as u32));
        }
        match self.dense[idx as usize] {
            e if e & MEMO_VALUE == 0 => Some(V::object(e)),
            e => self.values.get((e & !MEMO_VALUE) as usize).copied(),
        }
    }
}

impl Decoder<'_> {
    #[inline(always)]
    pub(super) fn memoize(&mut self, at: usize) -> Res<()> {
        let v = self.top(at, 0x94)?;
        self.memo_put(self.memo.len, v, at)
    }

    #[inline(always)]
    pub(super) fn memo_put(&mut self, idx: u64, v: V, at: usize) -> Res<()> {
        // An entry out of order goes to a hash map: key, value, its share of
        // the table and the old table while it grows (8). In order, an object
        // is an id (1; none while the memo is in runs); any other value is
        // also kept in the memo's values (2).
        let cost = if idx > self.memo.len {
            8
        } else if v.id().is_none() {
            2
        } else {
            1
        };
        self.count(cost, at)?;
        self.memo.put(idx, v).map_err(|full| {
            Box::new(match full {
                MemoFull::Values(limit) => DecodeError::Limit {
                    offset: at,
                    what: "memoized non-object values",
                    limit,
                },
                MemoFull::Memory(bytes) => DecodeError::Memory {
                    offset: at,
                    what: "memo",
                    bytes,
                },
            })
        })
    }

    #[inline(always)]
    pub(super) fn get(&mut self, idx: u64, at: usize, op: u8) -> Res<()> {
        match self.memo.get(idx) {
            Some(v) => self.push(v, at),
            None => Err(self.not_stored(idx, at, op)),
        }
    }

    #[cold]
    #[inline(never)]
    fn not_stored(&self, idx: u64, at: usize, op: u8) -> Fail {
        self.malformed(at, op, &format!("memo key {idx} was never stored"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_answers_alike_in_runs_and_dense() {
        // Ids that mostly follow their index, with a jump every seventh
        // entry: more runs than MAX_MEMO_RUNS, so the memo turns dense on
        // the way; then an overwrite, a memoized int and an out-of-order index.
        let mut memo = Memo::default();
        let mut want = Vec::new();
        let mut id = 0u32;
        for i in 0..10_000u64 {
            id += if i % 7 == 0 { 3 } else { 1 };
            let v = V::object(id);
            memo.put(i, v).unwrap();
            want.push(v);
            if i == 500 {
                assert!(memo.dense.is_empty(), "still runs at {i}");
                assert!(memo.runs.len() > 1);
            }
        }
        assert!(
            !memo.dense.is_empty(),
            "over {MAX_MEMO_RUNS} runs turn the memo dense"
        );
        memo.put(17, V::object(5)).unwrap();
        want[17] = V::object(5);
        memo.put(10_000, V::small(9)).unwrap();
        want.push(V::small(9));
        memo.put(20_000, V::TRUE).unwrap();
        for (i, v) in want.iter().enumerate() {
            assert_eq!(memo.get(i as u64), Some(*v), "index {i}");
        }
        assert_eq!(memo.get(20_000), Some(V::TRUE));
        assert_eq!(memo.get(10_001), None);

        // Few runs: an overwrite in run form turns it dense too.
        let mut memo = Memo::default();
        for i in 0..10 {
            memo.put(i, V::object(i as u32 + if i < 5 { 0 } else { 1 }))
                .unwrap();
        }
        assert_eq!(memo.runs.len(), 2);
        assert_eq!(memo.get(4), Some(V::object(4)));
        assert_eq!(memo.get(5), Some(V::object(6)));
        memo.put(2, V::NONE).unwrap();
        assert_eq!(
            (0..10).map(|i| memo.get(i)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
                .iter()
                .enumerate()
                .map(|(i, &id)| Some(if i == 2 { V::NONE } else { V::object(id) }))
                .collect::<Vec<_>>()
        );
    }
}
