//! The self-contained HTML report (`--report FILE.html`): one file with
//! inline CSS and SVG drawn here, no scripts, no network. Commands fill a
//! [`ReportData`] and call [`render`]; the timeline series are streamed into
//! [`Envelope`]s so a million-event replay still yields a small, fast page.

use super::svg;
pub use super::svg::Envelope;
use crate::units::human;
use std::fmt::Write;

/// Everything a report shows. Empty parts are left out of the page.
#[derive(Debug, Clone, Default)]
pub struct ReportData {
    pub title: String,
    /// What was analysed (command, inputs), shown under the title.
    pub subtitle: Option<String>,
    pub verdict: Verdict,
    /// `export PYTORCH_CUDA_ALLOC_CONF=…`, when there is one to recommend.
    pub export_line: Option<String>,
    /// Headline numbers shown as cards (peak reserved, capacity, …).
    pub figures: Vec<Figure>,
    /// One timeline per config, current first, overlaid on one chart.
    pub timelines: Vec<Timeline>,
    /// What the timeline's x axis counts ("event" or "time (s)").
    pub x_label: String,
    /// Device capacity, drawn as a line on the timeline.
    pub capacity: Option<u64>,
    pub segment_map: Option<SegmentMap>,
    pub findings: Vec<Finding>,
    /// "What to check next": the steps a reader takes, after the findings.
    pub next_steps: Vec<String>,
    pub top_sites: Vec<Site>,
    /// Heading of the sites table (default "Top allocation sites").
    pub sites_title: Option<String>,
    pub tables: Vec<Table>,
    /// Charts drawn by the caller (title, SVG and legend), after the timeline.
    pub charts: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub headline: String,
    pub tone: Tone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tone {
    /// The recommendation fixes it / no OOM.
    Good,
    /// Still out of memory, or nothing helps.
    Bad,
    #[default]
    Neutral,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figure {
    pub label: String,
    pub value: String,
}

/// Allocated and reserved bytes over the run of one config.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// The config, e.g. `expandable_segments:True` or "current (default)".
    pub name: String,
    pub allocated: Envelope,
    pub reserved: Envelope,
    /// The x at which this config ran out of memory.
    pub oom_at: Option<u64>,
}

impl Timeline {
    pub fn new(name: impl Into<String>) -> Self {
        Timeline {
            name: name.into(),
            ..Timeline::default()
        }
    }

    /// Records the state after one event (or at one time).
    pub fn push(&mut self, x: u64, allocated: u64, reserved: u64) {
        self.allocated.push(x, allocated);
        self.reserved.push(x, reserved);
    }

    /// The timeline of one replay (`ReplayOptions::timeline`), one point per
    /// event, with the OOM marked at the failing event.
    pub fn from_run(name: impl Into<String>, run: &crate::workload::RunResult) -> Self {
        let mut t = Timeline::new(name);
        for (x, p) in (0u64..).zip(&run.timeline) {
            t.push(x, p.allocated, p.reserved);
        }
        t.oom_at = run.figures.oom.as_ref().map(|o| o.event_index);
        t
    }
}

/// The allocator's segments at one moment (the peak or the OOM).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SegmentMap {
    /// When the map was taken, e.g. "at the peak (event 4 211)".
    pub at: String,
    pub segments: Vec<MapSegment>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct MapSegment {
    pub address: u64,
    pub stream: u64,
    /// In address order, tiling the segment.
    pub blocks: Vec<MapBlock>,
}

impl MapSegment {
    pub fn total_size(&self) -> u64 {
        self.blocks.iter().map(|b| b.size).sum()
    }
}

impl SegmentMap {
    /// The bundled allocator's segments (`CachingAllocator::segments`).
    pub fn from_allocator(
        at: impl Into<String>,
        segments: &[crate::allocator::SegmentInfo],
    ) -> Self {
        SegmentMap {
            at: at.into(),
            segments: segments.iter().map(MapSegment::from_allocator).collect(),
        }
    }

    /// The allocated blocks grouped by size, largest total first: what fills
    /// the memory at this moment when a trace carries no stack frames.
    pub fn live_by_size(&self, top: usize) -> Vec<Site> {
        let mut by_size: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        for b in self.segments.iter().flat_map(|s| &s.blocks) {
            if b.state == BlockState::Allocated {
                *by_size.entry(b.size).or_default() += 1;
            }
        }
        let mut sites: Vec<Site> = by_size
            .into_iter()
            .map(|(size, count)| Site {
                site: format!("blocks of {}", human(size)),
                bytes: size * count,
                count,
            })
            .collect();
        sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
        sites.truncate(top);
        sites
    }
}

impl SegmentMap {
    /// One device's segments of a decoded torch snapshot, as recorded.
    pub fn from_snapshot(
        at: impl Into<String>,
        snap: &crate::snapshot::Snapshot<'_>,
        device: u32,
    ) -> Self {
        use crate::snapshot::model::BlockState as S;
        let segments = snap
            .segments
            .iter()
            .filter(|s| s.device == device)
            .map(|s| {
                let blocks = snap.blocks_of(s);
                let split = blocks.len() > 1;
                MapSegment {
                    address: s.address,
                    stream: s.stream,
                    blocks: blocks
                        .iter()
                        .map(|b| MapBlock {
                            size: b.size,
                            state: match b.state {
                                S::ActiveAllocated => BlockState::Allocated,
                                S::ActivePendingFree => BlockState::PendingFree,
                                S::Inactive if split => BlockState::InactiveSplit,
                                S::Inactive => BlockState::Free,
                            },
                        })
                        .collect(),
                }
            })
            .collect();
        SegmentMap {
            at: at.into(),
            segments,
        }
    }
}

impl Timeline {
    /// A snapshot's recorded trace for one device: requested bytes of live
    /// allocations (alloc − free_completed) and reserved bytes (segment
    /// alloc/map − free/unmap), anchored so the series end at the snapshot's
    /// own figures (the ring buffer may have dropped the start). The x axis
    /// counts trace entries; the OOM entry, if any, is marked.
    pub fn from_snapshot_trace(
        name: impl Into<String>,
        snap: &crate::snapshot::Snapshot<'_>,
        device: u32,
    ) -> Self {
        use crate::snapshot::model::Action as A;
        let (mut requested, mut reserved) = (0i128, 0i128);
        let mut deltas: Vec<(i64, i64)> = Vec::with_capacity(snap.trace_len(device));
        let mut oom_at = None;
        for (i, e) in snap.trace(device).enumerate() {
            let Ok(e) = e else { continue };
            let size = i64::try_from(e.size).unwrap_or(i64::MAX);
            let d = match e.action {
                A::Alloc => (size, 0),
                A::FreeCompleted => (-size, 0),
                A::SegmentAlloc | A::SegmentMap => (0, size),
                A::SegmentFree | A::SegmentUnmap => (0, -size),
                A::Oom => {
                    oom_at.get_or_insert(i as u64);
                    (0, 0)
                }
                _ => (0, 0),
            };
            requested += i128::from(d.0);
            reserved += i128::from(d.1);
            deltas.push(d);
        }
        let segs = snap.segments.iter().filter(|s| s.device == device);
        let end_reserved: i128 = segs.clone().map(|s| i128::from(s.total_size)).sum();
        let end_requested: i128 = segs
            .map(|s| i128::from(s.requested_size.unwrap_or(s.active_size)))
            .sum();
        let mut req = end_requested - requested;
        let mut res = end_reserved - reserved;
        let mut t = Timeline::new(name);
        for (x, (dq, dr)) in (0u64..).zip(deltas) {
            req += i128::from(dq);
            res += i128::from(dr);
            let clamp = |v: i128| u64::try_from(v.max(0)).unwrap_or(u64::MAX);
            t.push(x, clamp(req), clamp(res));
        }
        t.oom_at = oom_at;
        t
    }
}

impl MapSegment {
    /// A segment of the bundled allocator as the map draws it. A free block
    /// is "inactive split" when its segment holds other blocks (PyTorch's
    /// `inactive_split`: it cannot be released), else a free segment.
    pub fn from_allocator(s: &crate::allocator::SegmentInfo) -> Self {
        use crate::allocator::BlockState as A;
        let split = s.blocks.len() > 1;
        MapSegment {
            address: s.address,
            stream: s.stream,
            blocks: s
                .blocks
                .iter()
                .map(|b| MapBlock {
                    size: b.size,
                    state: match b.state {
                        A::ActiveAllocated => BlockState::Allocated,
                        A::ActivePendingFree => BlockState::PendingFree,
                        A::Inactive if split => BlockState::InactiveSplit,
                        A::Inactive => BlockState::Free,
                    },
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapBlock {
    pub size: u64,
    pub state: BlockState,
}

/// How a block shows in the map, in memory_summary()'s vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    Allocated,
    /// Freed by the program, waiting on recorded stream uses.
    PendingFree,
    /// Free, in a segment that is split (not releasable: "non-releasable memory").
    InactiveSplit,
    /// Free, the whole segment (releasable by `empty_cache`).
    Free,
}

impl BlockState {
    /// The CSS class the map and the legend use.
    pub fn class(self) -> &'static str {
        match self {
            BlockState::Allocated => "allocated",
            BlockState::PendingFree => "pending",
            BlockState::InactiveSplit => "inactive",
            BlockState::Free => "free",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Finding {
    pub rule: String,
    pub severity: String,
    pub message: String,
    /// Evidence as label → value, in display order.
    pub evidence: Vec<(String, String)>,
}

/// One allocation site (a frame or a trace id prefix) and what it holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Site {
    pub site: String,
    pub bytes: u64,
    pub count: u64,
}

/// A plain table for any format (HTML here, Markdown in `markdown`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<TableRow>,
    /// A sentence under the table.
    pub note: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableRow {
    pub cells: Vec<String>,
    /// Why this row stands out (drawn highlighted, the reason in the last column).
    pub flag: Option<String>,
}

impl Table {
    /// A [`Grid`](super::common::Grid) as a report table, `lines` as its note.
    pub fn of_grid(g: &super::common::Grid, lines: &[String]) -> Table {
        Table {
            title: g.title.clone(),
            headers: g.header.clone(),
            rows: g
                .rows
                .iter()
                .map(|cells| TableRow {
                    cells: cells.clone(),
                    flag: None,
                })
                .collect(),
            note: (!lines.is_empty()).then(|| lines.join(" ")),
        }
    }

    /// The table for the terminal (`--format text`), flags in a last column.
    pub fn to_text(&self) -> String {
        let flagged = self.rows.iter().any(|r| r.flag.is_some());
        let mut t = comfy_table::Table::new();
        // The terminal's width when the binary set one, else a fixed width for pipes and tests.
        t.load_style(comfy_table::presets::UTF8_FULL_CONDENSED)
            .force_no_tty()
            .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
            .set_width(crate::report::common::text_width());
        let mut headers = self.headers.clone();
        if flagged {
            headers.push("flag".into());
        }
        t.set_header(headers);
        for r in &self.rows {
            let mut cells = r.cells.clone();
            if flagged {
                cells.push(r.flag.clone().unwrap_or_default());
            }
            t.add_row(cells);
        }
        let first = self.rows.first().map(|r| r.cells.as_slice()).unwrap_or(&[]);
        for (i, c) in first.iter().enumerate() {
            if numeric(c)
                && let Some(col) = t.column_mut(i)
            {
                col.set_cell_alignment(comfy_table::CellAlignment::Right);
            }
        }
        let mut s = format!("{}\n{t}\n", self.title);
        if let Some(note) = &self.note {
            s.push_str(note);
            s.push('\n');
        }
        s
    }
}

/// Escapes text for HTML element content and quoted attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

const CSS: &str = r#"
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#f6f8fa;--good:#1a7f37;--bad:#cf222e;--warn:#9a6700}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 -apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:var(--fg);background:#fff}
main{max-width:1200px;margin:0 auto;padding:24px 28px 40px}
h1{font-size:24px;margin:0 0 2px}
h2{font-size:17px;margin:28px 0 10px;padding-bottom:4px;border-bottom:1px solid var(--line)}
.sub{color:var(--muted);margin:0 0 16px}
.verdict{border-radius:8px;padding:12px 16px;font-size:16px;font-weight:600;border:1px solid var(--line);background:var(--bg)}
.verdict.good{border-color:#4ac26b;background:#dafbe1;color:#0f5323}
.verdict.bad{border-color:#ff8182;background:#ffebe9;color:#82071e}
.export{margin:10px 0 0;padding:10px 14px;background:#0d1117;color:#e6edf3;border-radius:8px;font:13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;overflow-x:auto;user-select:all}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:14px}
.card{border:1px solid var(--line);border-radius:8px;padding:8px 14px;min-width:150px;background:#fff}
.card .l{color:var(--muted);font-size:12px}.card .v{font-size:18px;font-weight:600;font-variant-numeric:tabular-nums}
svg{width:100%;height:auto;display:block}
.chart .grid line{stroke:#eaeef2}.chart .frame{fill:none;stroke:#afb8c1}
.chart text{font-size:11px;fill:var(--muted)}.chart .ytick{text-anchor:end}.chart .xtick{text-anchor:middle}
.chart .axis-label{text-anchor:middle;font-size:12px}
.chart polyline{fill:none;stroke-linejoin:round}
.chart .reserved{stroke-width:2}.chart .allocated{stroke-width:1.3;stroke-dasharray:5 3;opacity:.85}
.chart .allocated-band{stroke-width:.8;stroke-opacity:.75;fill-opacity:.3}
.sw.band{height:10px;border-top:0;background:#59636e;opacity:.35}
.chart .capacity{stroke:#cf222e;stroke-width:1.2;stroke-dasharray:2 3}.chart .capacity-label{fill:#cf222e;text-anchor:end}
.chart .oom{stroke-width:1.5;stroke-dasharray:6 3}.chart .oom-label{text-anchor:end;font-weight:600}
.legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:6px 0 0 78px;font-size:13px}
.legend span{display:inline-flex;align-items:center;gap:6px}
.sw{display:inline-block;width:22px;height:0;border-top:3px solid}.sw.dash{border-top-style:dashed;border-top-width:2px}
.box{display:inline-block;width:14px;height:14px;border-radius:2px;border:1px solid #8c959f}
.segmap .free,.box.free{fill:#fff;background:#fff;stroke:#8c959f;stroke-width:.8}
.segmap .allocated,.box.allocated{fill:#1971c2;background:#1971c2}
.segmap .inactive,.box.inactive{fill:#f59f00;background:#f59f00}
.segmap .pending,.box.pending{fill:#e03131;background:#e03131}
.segmap .seglabel{font-size:11px;fill:var(--muted)}
.segmap .seg:hover rect{stroke:#1f2328;stroke-width:1}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid #eaeef2;vertical-align:top}
th{background:var(--bg);font-weight:600}
td.n,th.n{text-align:right;white-space:nowrap}
tr.flag td{background:#fff8c5}
.note{color:var(--muted);font-size:13px;margin:6px 0 0}
.finding{border:1px solid var(--line);border-left:4px solid var(--muted);border-radius:6px;padding:8px 12px;margin:8px 0}
.finding.error,.finding.critical{border-left-color:var(--bad)}.finding.warning{border-left-color:var(--warn)}.finding.info{border-left-color:#0969da}
.finding .rule{font:12px ui-monospace,Menlo,monospace;color:var(--muted)}
.badge{display:inline-block;font-size:11px;font-weight:600;text-transform:uppercase;padding:0 6px;border-radius:10px;background:var(--bg);border:1px solid var(--line);margin-right:6px}
.finding dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0 0;font-size:13px}
.finding dt{color:var(--muted)}.finding dd{margin:0;font-variant-numeric:tabular-nums}
.bar{height:8px;background:#1971c2;border-radius:2px;min-width:1px}
footer{margin-top:32px;color:var(--muted);font-size:12px}
"#;

/// Renders the whole report as one HTML document.
pub fn render(data: &ReportData) -> String {
    let mut h = String::with_capacity(256 * 1024);
    let title = escape(&data.title);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title}</title><style>{CSS}</style></head><body><main>"
    );
    let _ = write!(h, "<h1>{title}</h1>");
    if let Some(sub) = &data.subtitle {
        let _ = write!(h, "<p class=\"sub\">{}</p>", escape(sub));
    }
    let tone = match data.verdict.tone {
        Tone::Good => "good",
        Tone::Bad => "bad",
        Tone::Neutral => "neutral",
    };
    let _ = write!(
        h,
        "<div class=\"verdict {tone}\" id=\"verdict\">{}</div>",
        escape(&data.verdict.headline)
    );
    if let Some(line) = &data.export_line {
        let _ = write!(
            h,
            "<pre class=\"export\" id=\"export\">{}</pre>",
            escape(line)
        );
    }
    if !data.figures.is_empty() {
        h.push_str("<div class=\"cards\">");
        for f in &data.figures {
            let _ = write!(
                h,
                "<div class=\"card\"><div class=\"l\">{}</div><div class=\"v\">{}</div></div>",
                escape(&f.label),
                escape(&f.value)
            );
        }
        h.push_str("</div>");
    }
    timeline_section(&mut h, data);
    for (title, chart) in &data.charts {
        let _ = write!(
            h,
            "<section class=\"chart-section\"><h2>{}</h2>{chart}</section>",
            escape(title)
        );
    }
    if let Some(map) = &data.segment_map {
        segment_section(&mut h, map);
    }
    findings_section(&mut h, &data.findings);
    if !data.next_steps.is_empty() {
        h.push_str("<section id=\"next\"><h2>What to check next</h2><ul>");
        for n in &data.next_steps {
            let _ = write!(h, "<li>{}</li>", escape(n));
        }
        h.push_str("</ul></section>");
    }
    sites_section(
        &mut h,
        data.sites_title
            .as_deref()
            .unwrap_or("Top allocation sites"),
        &data.top_sites,
    );
    for t in &data.tables {
        table_section(&mut h, t);
    }
    let _ = writeln!(
        h,
        "<footer>Generated by allocdoc {}. Self-contained: no scripts, no network.</footer></main></body></html>",
        env!("CARGO_PKG_VERSION")
    );
    h
}

fn timeline_section(h: &mut String, data: &ReportData) {
    if data.timelines.iter().all(|t| t.reserved.is_empty()) {
        return;
    }
    h.push_str("<section id=\"timeline\"><h2>Memory over the run</h2>");
    let x_label = if data.x_label.is_empty() {
        "event"
    } else {
        &data.x_label
    };
    h.push_str(&svg::timeline_chart(
        &data.timelines,
        data.capacity,
        x_label,
    ));
    h.push_str("<div class=\"legend\">");
    for (i, t) in data.timelines.iter().enumerate() {
        let colour = svg::PALETTE[i % svg::PALETTE.len()];
        let _ = write!(
            h,
            "<span><i class=\"sw\" style=\"border-color:{colour}\"></i>{} (peak reserved {})</span>",
            escape(&t.name),
            escape(&human(t.reserved.peak()))
        );
    }
    h.push_str("<span><i class=\"sw\" style=\"border-color:#59636e\"></i>reserved</span>");
    let (banded, lined): (Vec<&Timeline>, Vec<&Timeline>) = data
        .timelines
        .iter()
        .partition(|t| t.allocated.is_downsampled());
    if !lined.is_empty() {
        h.push_str(
            "<span><i class=\"sw dash\" style=\"border-color:#59636e\"></i>allocated</span>",
        );
    }
    if !banded.is_empty() {
        h.push_str("<span><i class=\"sw band\"></i>allocated, min–max per bucket of events</span>");
    }
    if data.capacity.is_some() {
        h.push_str("<span><i class=\"sw dash\" style=\"border-color:#cf222e\"></i>capacity</span>");
    }
    h.push_str("</div></section>");
}

fn segment_section(h: &mut String, map: &SegmentMap) {
    let reserved: u64 = map.segments.iter().map(MapSegment::total_size).sum();
    let mut by_state = [0u64; 4];
    for b in map.segments.iter().flat_map(|s| &s.blocks) {
        let slot = match b.state {
            BlockState::Allocated => 0,
            BlockState::InactiveSplit => 1,
            BlockState::Free => 2,
            BlockState::PendingFree => 3,
        };
        by_state[slot] += b.size;
    }
    let _ = write!(
        h,
        "<section id=\"segments\"><h2>Segments {}</h2><p class=\"note\">{} segment{}, {} reserved. Largest first; one scale for all; hover a segment for its address.</p>",
        escape(&map.at),
        map.segments.len(),
        if map.segments.len() == 1 { "" } else { "s" },
        escape(&human(reserved))
    );
    let (svg, hidden) = svg::segment_map(map);
    h.push_str(&svg);
    h.push_str("<div class=\"legend\" style=\"margin-left:0\">");
    for (state, bytes, label) in [
        (BlockState::Allocated, by_state[0], "allocated"),
        (
            BlockState::InactiveSplit,
            by_state[1],
            "inactive split (free, not releasable)",
        ),
        (BlockState::Free, by_state[2], "free segment (releasable)"),
        (
            BlockState::PendingFree,
            by_state[3],
            "freed, pending stream use",
        ),
    ] {
        if bytes == 0 && state == BlockState::PendingFree {
            continue;
        }
        let _ = write!(
            h,
            "<span><i class=\"box {}\"></i>{label}: {}</span>",
            state.class(),
            escape(&human(bytes))
        );
    }
    h.push_str("</div>");
    if hidden > 0 {
        let _ = write!(
            h,
            "<p class=\"note\">{hidden} smaller segments not drawn.</p>"
        );
    }
    h.push_str("</section>");
}

fn findings_section(h: &mut String, findings: &[Finding]) {
    if findings.is_empty() {
        return;
    }
    h.push_str("<section id=\"findings\"><h2>Findings</h2>");
    for f in findings {
        let sev = escape(&f.severity.to_ascii_lowercase());
        let _ = write!(
            h,
            "<div class=\"finding {sev}\"><span class=\"badge\">{sev}</span><span class=\"rule\">{}</span><div>{}</div>",
            escape(&f.rule),
            escape(&f.message)
        );
        if !f.evidence.is_empty() {
            h.push_str("<dl>");
            for (k, v) in &f.evidence {
                let _ = write!(h, "<dt>{}</dt><dd>{}</dd>", escape(k), escape(v));
            }
            h.push_str("</dl>");
        }
        h.push_str("</div>");
    }
    h.push_str("</section>");
}

fn sites_section(h: &mut String, title: &str, sites: &[Site]) {
    if sites.is_empty() {
        return;
    }
    let top = sites.iter().map(|s| s.bytes).max().unwrap_or(0).max(1);
    let _ = write!(
        h,
        "<section id=\"sites\"><h2>{}</h2><table><thead><tr><th>site</th><th class=\"n\">bytes</th><th class=\"n\">allocations</th><th style=\"width:30%\"></th></tr></thead><tbody>",
        escape(title)
    );
    for s in sites {
        let pct = s.bytes as f64 / top as f64 * 100.0;
        let _ = write!(
            h,
            "<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td><div class=\"bar\" style=\"width:{pct:.1}%\"></div></td></tr>",
            escape(&s.site),
            escape(&human(s.bytes)),
            s.count
        );
    }
    h.push_str("</tbody></table></section>");
}

/// True when a cell reads as a number or a size (right-aligned).
fn numeric(cell: &str) -> bool {
    cell.chars().next().is_some_and(|c| c.is_ascii_digit()) || cell == "—"
}

fn table_section(h: &mut String, t: &Table) {
    let flagged = t.rows.iter().any(|r| r.flag.is_some());
    // A column is right-aligned (header and cells) when most of its cells are numbers.
    let numeric_col: Vec<bool> = (0..t.headers.len())
        .map(|i| {
            let n = t
                .rows
                .iter()
                .filter(|r| r.cells.get(i).is_some_and(|c| numeric(c)))
                .count();
            2 * n > t.rows.len()
        })
        .collect();
    let class = |i: usize| {
        if numeric_col.get(i).copied().unwrap_or(false) {
            " class=\"n\""
        } else {
            ""
        }
    };
    let _ = write!(
        h,
        "<section><h2>{}</h2><table><thead><tr>",
        escape(&t.title)
    );
    for (i, head) in t.headers.iter().enumerate() {
        let _ = write!(h, "<th{}>{}</th>", class(i), escape(head));
    }
    if flagged {
        h.push_str("<th>flag</th>");
    }
    h.push_str("</tr></thead><tbody>");
    for r in &t.rows {
        h.push_str(if r.flag.is_some() {
            "<tr class=\"flag\">"
        } else {
            "<tr>"
        });
        for (i, c) in r.cells.iter().enumerate() {
            let _ = write!(h, "<td{}>{}</td>", class(i), escape(c));
        }
        if flagged {
            let _ = write!(h, "<td>{}</td>", escape(r.flag.as_deref().unwrap_or("")));
        }
        h.push_str("</tr>");
    }
    h.push_str("</tbody></table>");
    if let Some(note) = &t.note {
        let _ = write!(h, "<p class=\"note\">{}</p>", escape(note));
    }
    h.push_str("</section>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn empty_parts_are_left_out() {
        let html = render(&ReportData {
            title: "t".into(),
            ..ReportData::default()
        });
        assert!(!html.contains("<svg"));
        assert!(!html.contains("id=\"findings\""));
        assert!(html.ends_with("</html>\n"));
    }
}
