//! What follows the trace's last entry: the end state matched with the
//! lives still open (the rest were live before the trace), the categories
//! given, then the moments, the growth, the timeline and the notes.

use super::frames::{Class, category};
use super::{
    At, Attribution, Attributor, Grouping, Life, MomentKind, NEVER, PRE, RECORD_STACKS, Stacks,
    index32, plural, push,
};
use crate::allocator::sizes::round_size;
use crate::evidence::fills::Category;
use crate::snapshot::model::{BlockState, Frames};

impl<'s, 'a> Attributor<'s, 'a> {
    /// The attribution, once every entry was fed. `step_starts` are the alloc
    /// indices where steps after the first begin (`StepScan::finish`).
    pub fn finish(mut self, step_starts: &[u32]) -> Attribution {
        self.settle();
        let traced = self.fed.traced;
        let mut notes = std::mem::take(&mut self.end_notes);
        let stacks = self.stacks_recorded();
        let last = i64::try_from(self.fed.entries).unwrap_or(i64::MAX) - 1;
        // The moments asked for, in the order they are listed.
        let mut asked: Vec<(MomentKind, i64, Option<usize>)> = Vec::new();
        let peak = self.fed.peak.filter(|_| traced);
        let only = self.ask.headline_only;
        let oom_too = self.fed.oom.is_some();
        if let Some(p) = peak.filter(|_| !(only && oom_too)) {
            asked.push((MomentKind::Peak, p, usize::try_from(p).ok()));
        }
        if let Some((k, ..)) = self.fed.oom {
            asked.push((MomentKind::Oom, k as i64 - 1, Some(k)));
        }
        let end_index = (traced && self.fed.entries > 0).then(|| self.fed.entries - 1);
        if !only || asked.is_empty() {
            asked.push((MomentKind::End, last, end_index));
        }
        match self.ask.at {
            Some(At::Event(n)) => {
                let i = usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .min(self.fed.entries.saturating_sub(1));
                if self.fed.entries > 0 {
                    asked.push((MomentKind::Event, i as i64, Some(i)));
                }
                if u64::try_from(self.fed.entries).is_ok_and(|e| n >= e) {
                    notes.push(format!(
                        "--at {n} is past the trace's last entry ({last}): the state after it is shown"
                    ));
                }
            }
            Some(At::Time(t)) => {
                let span = self
                    .fed
                    .first_time
                    .map(|f| self.fed.last_time.saturating_sub(f));
                if span.is_some_and(|s| t > s) {
                    notes.push(format!(
                        "--at {}: past the trace's last entry, {} after its first: the state after it is shown",
                        human_us(t),
                        human_us(span.unwrap_or(0))
                    ));
                }
                let s = self.fed.at_time.map_or(-1, |i| i as i64);
                asked.push((MomentKind::Time, s, self.fed.at_time));
            }
            None => {}
        }
        let steps = u64::try_from(step_starts.len())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        // Without stacks, code cannot group memory: by block size and by
        // segment instead, each moment, when asked.
        let by = self.ask.by;
        let groupings = if self.ask.blocks_without_stacks
            && stacks == Stacks::None
            && matches!(by, Grouping::Site | Grouping::User | Grouping::Stack)
        {
            vec![Grouping::Size, Grouping::Segment]
        } else {
            vec![by]
        };
        let asked: Vec<_> = asked
            .iter()
            .flat_map(|&a| groupings.iter().map(move |&g| (g, a)))
            .collect();
        // Each moment, the growth and the timeline read the lives apart:
        // on a long trace, on every core.
        let this = &self;
        let (mut moments, (growth, timeline)) = rayon::join(
            || {
                use rayon::prelude::*;
                asked
                    .par_iter()
                    .map(|&(by, (kind, s, i))| this.moment(by, kind, s, i))
                    .collect::<Vec<_>>()
            },
            || rayon::join(|| this.growth(step_starts), || this.timeline()),
        );
        if let Some((_, request, free)) = self.fed.oom {
            for m in moments.iter_mut().filter(|m| m.moment == MomentKind::Oom) {
                m.request_bytes = Some(request);
                m.device_free_bytes = Some(free);
            }
        }
        self.notes(traced, stacks, &mut notes);
        let mut late_oom = None;
        // Growth needs three step starts to be seen: with fewer, nothing
        // says the steps do not grow.
        if let Some((k, ..)) = self.fed.oom
            && growth.is_empty()
            && steps >= 3
        {
            // The step the OOM comes in: the steps begun before its entry.
            let step = 1 + step_starts
                .iter()
                .filter(|&&s| {
                    self.fed
                        .lives
                        .get(s as usize)
                        .is_some_and(|l| (l.born as usize) < k)
                })
                .count();
            if step >= 2 {
                late_oom = Some(late_oom_note(step, steps));
                notes.extend(late_oom.clone());
            }
        }
        Attribution {
            device_index: self.device,
            trace_entries: self.fed.entries as u64,
            traced,
            stacks,
            peak_event_index: peak.and_then(|p| u64::try_from(p).ok()),
            moments,
            steps: if traced { steps } else { 0 },
            growth,
            notes,
            late_oom,
            timeline,
        }
    }

    /// The end state matched and the categories given, once every entry
    /// was fed (a second call does nothing).
    pub fn settle(&mut self) {
        if self.settled {
            return;
        }
        self.settled = true;
        if self.fed.peak_only.is_some() {
            // `peak_entry` set `traced` as lives and `pre` would have it.
            return;
        }
        self.fed.traced = !self.fed.lives.is_empty() || !self.fed.pre.is_empty();
        self.resolve();
        let mut notes = Vec::new();
        self.end_state(self.fed.traced, &mut notes);
        self.end_notes = notes;
        self.categorise();
    }

    /// Each life's stack from its frames list (classified on first sight,
    /// in alloc order, so stacks are numbered as the trace first shows
    /// them) and its block: the request rounded as `round_size` rounds it
    /// under the recorded settings (the segments' own block, where they
    /// still hold it, comes at [`Self::end_state`]).
    fn resolve(&mut self) {
        let mut lives = std::mem::take(&mut self.fed.lives);
        // Runs of allocations share a stack: one lookup per run.
        let mut last = (Frames::NONE.0, 0);
        for l in &mut lives {
            if l.stack != last.0 {
                last = (l.stack, self.stack_of(Frames(l.stack)));
            }
            l.stack = last.1;
            l.block = round_size(l.bytes, &self.settings);
        }
        self.fed.lives = lives;
        for l in &mut self.fed.pre {
            l.block = round_size(l.bytes, &self.settings);
        }
    }

    /// Matches the segments' active blocks with the trace's live allocations:
    /// the rest were live before the trace (or, with no trace, are the state).
    fn end_state(&mut self, traced: bool, notes: &mut Vec<String>) {
        let snap = self.snap;
        let mut matched = 0usize;
        let (mut differ, mut matched_bytes) = (0u64, 0u64);
        let device = self.device;
        // The allocations still open, by address: blocks come by address, so
        // a cursor finds each (a search where one comes out of order) instead
        // of a hash lookup per block of a large snapshot.
        let mut open: Vec<(u64, u32)> = self.fed.live.iter().map(|(&a, &(k, _))| (a, k)).collect();
        open.sort_unstable();
        let mut cursor = 0usize;
        let mut find = |addr: u64| -> Option<u32> {
            if open.get(cursor).is_some_and(|&(a, _)| a > addr)
                || cursor
                    .checked_sub(1)
                    .and_then(|c| open.get(c))
                    .is_some_and(|&(a, _)| a >= addr)
            {
                cursor = open.partition_point(|&(a, _)| a < addr);
            }
            while open.get(cursor).is_some_and(|&(a, _)| a < addr) {
                cursor += 1;
            }
            open.get(cursor)
                .filter(|&&(a, _)| a == addr)
                .map(|&(_, k)| k)
        };
        for seg in snap.segments.iter().filter(|s| s.device == device) {
            for b in snap.blocks_of(seg) {
                if b.state == BlockState::Inactive {
                    continue;
                }
                if let Some(k) = find(b.address)
                    && let Some(l) = self.fed.lives.get_mut(k as usize)
                {
                    matched += 1;
                    matched_bytes = matched_bytes.saturating_add(l.bytes);
                    differ += u64::from(l.bytes != b.requested_size);
                    l.block = b.size;
                    continue;
                }
                let stack = match self.stack_of(b.frames) {
                    // No stack on a block the trace never made: the pre-trace row.
                    0 if traced => 1,
                    s => s,
                };
                let life = Life {
                    addr: b.address,
                    bytes: b.requested_size,
                    block: b.size,
                    born: PRE,
                    died: NEVER,
                    stack,
                    category: Category::Unknown,
                };
                self.fed.refused |= !push(&mut self.fed.pre, life);
            }
        }
        let unmatched = self.fed.live.len().saturating_sub(matched);
        if unmatched > 0 {
            let bytes = self
                .fed
                .live
                .values()
                .map(|&(_, b)| b)
                .fold(0u64, u64::saturating_add)
                .saturating_sub(matched_bytes);
            notes.push(format!(
                "{unmatched} allocation{} the trace leaves live ({}) {} not in the snapshot's segments: the trace and the segments disagree, and the figures follow the trace",
                plural(unmatched as u64),
                crate::units::format_size(bytes),
                if unmatched == 1 { "is" } else { "are" },
            ));
        }
        if differ > 0 {
            notes.push(format!(
                "{differ} live block{} of the segments record{} another requested size than the trace's alloc at {} address: the trace's size is counted",
                plural(differ),
                if differ == 1 { "s" } else { "" },
                if differ == 1 { "its" } else { "their" },
            ));
        }
    }

    /// Each allocation's category: the rule class of its stack, with
    /// backward and optimizer allocations told apart by whether they outlive
    /// the run of allocations of their class (their phase).
    fn categorise(&mut self) {
        let n = index32(self.fed.entries);
        let classes: Vec<Class> = self
            .fed
            .lives
            .iter()
            .map(|l| {
                self.stacks
                    .get(l.stack as usize)
                    .map_or(Class::Unknown, |s| s.class)
            })
            .collect();
        let mut start = 0;
        while start < self.fed.lives.len() {
            let class = classes.get(start).copied().unwrap_or(Class::Unknown);
            let end = classes
                .get(start..)
                .unwrap_or_default()
                .iter()
                .position(|&c| c != class)
                .map_or(self.fed.lives.len(), |p| start + p);
            // The phase ends at the next alloc of another class.
            let next = self.fed.lives.get(end).map_or(n, |l| l.born);
            for k in start..end {
                let Some(l) = self.fed.lives.get(k) else {
                    continue;
                };
                let outlives = l.died == NEVER || l.died > next;
                let cat = category(class, self.accumulates(l.stack), outlives);
                if let Some(l) = self.fed.lives.get_mut(k) {
                    l.category = cat;
                }
            }
            start = end;
        }
        for k in 0..self.fed.pre.len() {
            let Some(&l) = self.fed.pre.get(k) else {
                continue;
            };
            let class = self
                .stacks
                .get(l.stack as usize)
                .map_or(Class::Unknown, |s| s.class);
            let cat = category(class, self.accumulates(l.stack), true);
            if let Some(l) = self.fed.pre.get_mut(k) {
                l.category = cat;
            }
        }
    }

    pub(super) fn all_lives(&self) -> impl Iterator<Item = &Life> + '_ {
        self.fed.lives.iter().chain(self.fed.pre.iter())
    }

    fn notes(&self, traced: bool, stacks: Stacks, notes: &mut Vec<String>) {
        let freed: Vec<&Life> = self.fed.pre.iter().filter(|l| l.died != NEVER).collect();
        if !freed.is_empty() {
            let bytes = freed
                .iter()
                .map(|l| l.bytes)
                .fold(0u64, u64::saturating_add);
            notes.push(format!(
                "the trace starts mid-run: it frees {} allocation{} ({}) it never saw allocated; they count as live from before the trace began until their free",
                freed.len(),
                plural(freed.len() as u64),
                crate::units::format_size(bytes)
            ));
        }
        if self.fed.replaced > 0 {
            notes.push(format!(
                "{} alloc entr{} land on an address still live with no free in between (entries are missing): the earlier allocation counts as freed there",
                self.fed.replaced,
                if self.fed.replaced == 1 { "y" } else { "ies" }
            ));
        }
        if self.fed.out_of_order > 0 {
            notes.push(format!(
                "{} trace entr{} recorded earlier than the entry before {}: the entries are taken in file order",
                self.fed.out_of_order,
                if self.fed.out_of_order == 1 { "y is" } else { "ies are" },
                if self.fed.out_of_order == 1 { "it" } else { "them" }
            ));
        }
        if self.fed.ooms > 1 {
            notes.push(format!(
                "the trace records {} OOMs; the last is shown",
                self.fed.ooms
            ));
        }
        if !traced {
            notes.push(
                "this snapshot holds no recorded allocations (no trace, or a trace without alloc and free entries): only the state at its end can be attributed"
                    .to_string(),
            );
        }
        if stacks == Stacks::None && (traced || !self.fed.pre.is_empty()) {
            notes.push(format!(
                "no stacks are recorded, so memory cannot be tied to code; record them with {RECORD_STACKS}"
            ));
        }
        if self.fed.refused {
            notes.push("the system refused memory for the attribution's tables: some allocations are left out".to_string());
        }
    }
}

/// A time in microseconds as `--at` takes it back (`2.5s`, `300ms`, `120us`).
fn human_us(us: i64) -> String {
    if us >= 1_000_000 {
        format!("{}s", us as f64 / 1e6)
    } else if us >= 1_000 {
        format!("{}ms", us as f64 / 1e3)
    } else {
        format!("{us}us")
    }
}

/// An OOM after steps that ran without one, with nothing growing from step
/// to step: the run's cache, which `forecast` replays.
fn late_oom_note(step: usize, steps: u64) -> String {
    format!(
        "the OOM comes in step {step} of the {steps} steps the trace holds, after {} ran without one, and no allocation grows from step to step: where the step's size varies (variable lengths, a last partial batch, evaluation), the cache keeps blocks between steps and reserved memory ratchets above any one step's peak. To see the step where a whole run runs out of memory, and the config and the cap on the size that carry it, record one step at two sizes (allocdoc.capture.record_sizes in Python) and run `{FORECAST_RECIPE}`",
        step - 1
    )
}

/// The command a late OOM's note gives.
const FORECAST_RECIPE: &str =
    "allocdoc forecast size1.pickle size2.pickle --sizes 1,2 --run steps.txt --capacity <the card>";
