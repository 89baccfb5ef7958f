//! SVG drawn by hand for the HTML report: the memory timeline (min/max
//! envelopes, so a million events cost a few thousand points) and the segment
//! map. Every string placed in the SVG goes through [`super::html::escape`].

use super::html::{BlockState, SegmentMap, Timeline, escape};
use crate::units::human;
use std::fmt::Write;

/// Buckets an [`Envelope`] keeps at most; each draws two points, so one
/// polyline never has more than `2 * MAX_BUCKETS` points.
pub const MAX_BUCKETS: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Bucket {
    min: (u64, u64),
    max: (u64, u64),
}

impl Bucket {
    fn point(x: u64, y: u64) -> Self {
        Bucket {
            min: (x, y),
            max: (x, y),
        }
    }

    fn add(&mut self, x: u64, y: u64) {
        if y < self.min.1 {
            self.min = (x, y);
        }
        if y > self.max.1 {
            self.max = (x, y);
        }
    }

    fn merge(self, other: Bucket) -> Bucket {
        Bucket {
            min: if other.min.1 < self.min.1 {
                other.min
            } else {
                self.min
            },
            max: if other.max.1 > self.max.1 {
                other.max
            } else {
                self.max
            },
        }
    }
}

/// A streaming min/max downsampler: takes points one by one (x increasing)
/// and keeps at most [`MAX_BUCKETS`] buckets of equal point count, each
/// remembering its lowest and highest point. When the buckets fill up, pairs
/// are merged and each bucket covers twice as many points, so memory stays
/// constant whatever the length of the run and no peak is ever lost.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    buckets: Vec<Bucket>,
    pending: Option<Bucket>,
    pending_len: u64,
    /// Points per full bucket (a power of two).
    width: u64,
    last_x: u64,
    peak: u64,
}

impl Default for Envelope {
    fn default() -> Self {
        Envelope {
            buckets: Vec::with_capacity(MAX_BUCKETS),
            pending: None,
            pending_len: 0,
            width: 1,
            last_x: 0,
            peak: 0,
        }
    }
}

impl Envelope {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, x: u64, y: u64) {
        self.last_x = x;
        self.peak = self.peak.max(y);
        match &mut self.pending {
            Some(b) => b.add(x, y),
            None => self.pending = Some(Bucket::point(x, y)),
        }
        self.pending_len += 1;
        if self.pending_len == self.width
            && let Some(b) = self.pending.take()
        {
            self.pending_len = 0;
            self.buckets.push(b);
            if self.buckets.len() == MAX_BUCKETS {
                self.halve();
            }
        }
    }

    /// Merges neighbouring buckets pairwise; each now covers twice the points.
    fn halve(&mut self) {
        let merged: Vec<Bucket> = self
            .buckets
            .chunks(2)
            .filter_map(|pair| pair.iter().copied().reduce(Bucket::merge))
            .collect();
        self.buckets = merged;
        self.width *= 2;
    }

    /// The highest y seen.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// The last x seen.
    pub fn last_x(&self) -> u64 {
        self.last_x
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty() && self.pending.is_none()
    }

    /// True once a bucket holds more than one point.
    pub fn is_downsampled(&self) -> bool {
        self.width > 1
    }

    /// Per bucket: its first x, lowest and highest y (for drawing a band).
    pub fn band(&self) -> Vec<(u64, u64, u64)> {
        self.buckets
            .iter()
            .chain(self.pending.iter())
            .map(|b| (b.min.0.min(b.max.0), b.min.1, b.max.1))
            .collect()
    }

    /// The points to draw, in x order: each bucket's extremes in the order they occurred.
    pub fn points(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(2 * (self.buckets.len() + 1));
        for b in self.buckets.iter().chain(self.pending.iter()) {
            let (first, second) = if b.min.0 <= b.max.0 {
                (b.min, b.max)
            } else {
                (b.max, b.min)
            };
            out.push(first);
            if second != first {
                out.push(second);
            }
        }
        out
    }
}

/// Colours per config, current first; picked for contrast on white and in grey scale.
pub const PALETTE: [&str; 6] = [
    "#d9480f", "#1971c2", "#2f9e44", "#9c36b5", "#e67700", "#495057",
];

const CHART_W: f64 = 1120.0;
const CHART_H: f64 = 360.0;
const PAD_L: f64 = 78.0;
const PAD_R: f64 = 16.0;
const PAD_T: f64 = 14.0;
const PAD_B: f64 = 40.0;

/// A "nice" step for about `target` intervals over `span`, in 1/2/5 × 10ⁿ.
fn decimal_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1.0);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// A byte step for about `target` intervals: 1/2/5/10/20/50/100/200/500 of a binary unit.
fn byte_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1.0);
    let mut unit = 1.0;
    while unit * 1024.0 <= raw {
        unit *= 1024.0;
    }
    [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1024.0]
        .iter()
        .map(|m| m * unit)
        .find(|s| *s >= raw)
        .unwrap_or(1024.0 * unit)
}

/// A short count label: 950, 12k, 1.5M.
fn count_label(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_owned).unwrap_or(s)
}

/// A byte tick label: "0", "512 MiB", "1.5 GiB".
fn size_label(v: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if v <= 0.0 {
        return "0".into();
    }
    let mut v = v;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{} {}", trim(v), UNITS[i])
}

/// The top of a memory axis for data peaking at `data_peak`, and whether the
/// card (`capacity`) is drawn on it. The axis is scaled to the data: a card
/// more than twice the peak (an 80 GiB card under a 2.59 GiB run) would flatten
/// the data into a line at the bottom, so it is marked above the axis instead.
fn memory_axis(data_peak: u64, capacity: Option<u64>) -> (f64, bool) {
    let data_peak = data_peak.max(1);
    match capacity {
        Some(c) if c <= data_peak.saturating_mul(2) => (data_peak.max(c) as f64, true),
        _ => (data_peak as f64, false),
    }
}

/// A chart's plot area: entries (or seconds) across, bytes up.
struct Axes {
    max_x: f64,
    max_y: f64,
    y_step: f64,
    plot_w: f64,
    plot_h: f64,
    /// The y axis counts (a knob's value), not bytes.
    counts: bool,
}

impl Axes {
    /// Axes for `max_x` entries and data peaking at `data_peak` bytes, and
    /// whether the card is drawn on them ([`memory_axis`]).
    fn new(max_x: f64, data_peak: u64, capacity: Option<u64>) -> (Self, bool) {
        let (peak, on_axis) = memory_axis(data_peak, capacity);
        let y_step = byte_step(peak, 5.0);
        let axes = Axes {
            max_x,
            max_y: (peak * 1.04 / y_step).ceil() * y_step,
            y_step,
            plot_w: CHART_W - PAD_L - PAD_R,
            plot_h: CHART_H - PAD_T - PAD_B,
            counts: false,
        };
        (axes, on_axis)
    }

    /// Axes for `max_x` across and counts up to `max_y` (a knob's value).
    fn counts(max_x: f64, max_y: f64) -> Self {
        let y_step = decimal_step(max_y.max(1.0), 5.0);
        Axes {
            max_x,
            max_y: (max_y.max(1.0) * 1.04 / y_step).ceil() * y_step,
            y_step,
            plot_w: CHART_W - PAD_L - PAD_R,
            plot_h: CHART_H - PAD_T - PAD_B,
            counts: true,
        }
    }

    fn sx(&self, x: f64) -> f64 {
        PAD_L + x / self.max_x * self.plot_w
    }

    fn sy(&self, y: f64) -> f64 {
        PAD_T + self.plot_h - y / self.max_y * self.plot_h
    }

    /// The chart's opening: the `<svg>` element, the grid with its ticks and
    /// the x axis's label.
    fn open(&self, aria_label: &str, x_label: &str) -> String {
        let (plot_h, max_y, max_x, y_step) = (self.plot_h, self.max_y, self.max_x, self.y_step);
        let mut s = String::with_capacity(64 * 1024);
        let _ = write!(
            s,
            r#"<svg class="chart" viewBox="0 0 {CHART_W} {CHART_H}" role="img" aria-label="{}" xmlns="http://www.w3.org/2000/svg"><g class="grid">"#,
            escape(aria_label)
        );
        let mut y = 0.0;
        while y <= max_y + 0.5 {
            let py = self.sy(y);
            let _ = write!(
                s,
                r#"<line x1="{PAD_L}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}"/><text class="ytick" x="{:.1}" y="{:.1}">{}</text>"#,
                CHART_W - PAD_R,
                PAD_L - 6.0,
                py + 4.0,
                if self.counts {
                    count_label(y)
                } else {
                    size_label(y)
                }
            );
            y += y_step;
        }
        let x_step = decimal_step(max_x, 8.0);
        let mut x = 0.0;
        while x <= max_x + 0.5 {
            let px = self.sx(x);
            let _ = write!(
                s,
                r#"<line x1="{px:.1}" y1="{PAD_T}" x2="{px:.1}" y2="{:.1}"/><text class="xtick" x="{px:.1}" y="{:.1}">{}</text>"#,
                PAD_T + plot_h,
                PAD_T + plot_h + 16.0,
                count_label(x)
            );
            x += x_step;
        }
        let _ = write!(
            s,
            r#"</g><text class="axis-label" x="{:.1}" y="{:.1}">{}</text>"#,
            PAD_L + self.plot_w / 2.0,
            CHART_H - 4.0,
            escape(x_label)
        );
        s
    }
}

/// The card's capacity: a line at its height when it is on the axis
/// ([`memory_axis`]), else a label at the top edge saying it lies above.
fn capacity_mark(s: &mut String, capacity: Option<u64>, on_axis: bool, sy: impl Fn(f64) -> f64) {
    let Some(cap) = capacity else { return };
    let x = CHART_W - PAD_R - 4.0;
    if on_axis {
        let py = sy(cap as f64);
        let _ = write!(
            s,
            r#"<line class="capacity" x1="{PAD_L}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}"/><text class="capacity-label" x="{x:.1}" y="{:.1}">capacity {}</text>"#,
            CHART_W - PAD_R,
            py - 5.0,
            escape(&human(cap))
        );
    } else {
        let _ = write!(
            s,
            r#"<text class="capacity-label" x="{x:.1}" y="{:.1}">↑ capacity {}, above this axis</text>"#,
            PAD_T + 14.0,
            escape(&human(cap))
        );
    }
}

/// The memory timeline: reserved (solid) and allocated (dashed) per config,
/// overlaid on shared axes, with the capacity and each OOM marked.
pub fn timeline_chart(timelines: &[Timeline], capacity: Option<u64>, x_label: &str) -> String {
    let max_x = timelines
        .iter()
        .map(|t| t.reserved.last_x().max(t.allocated.last_x()))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let data_peak = timelines
        .iter()
        .map(|t| t.reserved.peak().max(t.allocated.peak()))
        .max()
        .unwrap_or(0);
    let (axes, on_axis) = Axes::new(max_x, data_peak, capacity);
    let (sx, sy) = (|x| axes.sx(x), |y| axes.sy(y));
    let (plot_w, plot_h) = (axes.plot_w, axes.plot_h);
    let mut s = axes.open("memory timeline", x_label);
    capacity_mark(&mut s, capacity, on_axis, sy);

    for (i, t) in timelines.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let name = escape(&t.name);
        for (env, class, what) in [
            (&t.reserved, "reserved", "reserved"),
            (&t.allocated, "allocated", "allocated"),
        ] {
            if env.is_empty() {
                continue;
            }
            // A downsampled allocated series swings within each bucket: a shaded
            // min–max band reads better than a zigzag line.
            if class == "allocated" && env.is_downsampled() {
                let band = env.band();
                let _ = write!(
                    s,
                    r#"<polygon class="allocated-band" fill="{colour}" stroke="{colour}" points=""#
                );
                let upper = band.iter().map(|&(x, _, hi)| (x, hi));
                let lower = band.iter().rev().map(|&(x, lo, _)| (x, lo));
                for (k, (px, py)) in upper.chain(lower).enumerate() {
                    if k > 0 {
                        s.push(' ');
                    }
                    let _ = write!(s, "{:.1},{:.1}", sx(px as f64), sy(py as f64));
                }
                let _ = write!(
                    s,
                    r#""><title>{name}: {what} (min–max per bucket), peak {}</title></polygon>"#,
                    escape(&human(env.peak()))
                );
                continue;
            }
            let _ = write!(s, r#"<polyline class="{class}" stroke="{colour}" points=""#);
            for (k, (px, py)) in env.points().into_iter().enumerate() {
                if k > 0 {
                    s.push(' ');
                }
                let _ = write!(s, "{:.1},{:.1}", sx(px as f64), sy(py as f64));
            }
            let _ = write!(
                s,
                r#""><title>{name}: {what}, peak {}</title></polyline>"#,
                escape(&human(env.peak()))
            );
        }
        if let Some(at) = t.oom_at {
            let px = sx(at as f64);
            let _ = write!(
                s,
                r#"<line class="oom" stroke="{colour}" x1="{px:.1}" y1="{PAD_T}" x2="{px:.1}" y2="{:.1}"/><text class="oom-label" style="fill:{colour}" x="{:.1}" y="{:.1}">OOM: {name} at event {}</text>"#,
                PAD_T + plot_h,
                px - 4.0,
                PAD_T + 14.0 + 16.0 * i as f64,
                count_label(at as f64)
            );
        }
    }
    let _ = write!(
        s,
        r#"<rect class="frame" x="{PAD_L}" y="{PAD_T}" width="{plot_w:.1}" height="{plot_h:.1}"/></svg>"#
    );
    s
}

/// One layer of a stacked chart: its name, colour and height at each point.
pub struct Layer<'a> {
    pub name: &'a str,
    pub colour: &'a str,
    pub values: Vec<u64>,
}

/// Memory stacked by layer over the x of each point (`xs`), the axis scaled
/// to the data, with vertical marks (x, label) such as the peak and the OOM,
/// and an optional horizontal line (the card's capacity).
pub fn stacked_chart(
    xs: &[u64],
    layers: &[Layer],
    marks: &[(u64, String)],
    capacity: Option<u64>,
    x_label: &str,
) -> String {
    let max_x = xs.last().copied().unwrap_or(0).max(1) as f64;
    let totals: Vec<u64> = (0..xs.len())
        .map(|i| {
            layers
                .iter()
                .map(|l| l.values.get(i).copied().unwrap_or(0))
                .sum()
        })
        .collect();
    let data_peak = totals.iter().copied().max().unwrap_or(0);
    let (axes, on_axis) = Axes::new(max_x, data_peak, capacity);
    let (sx, sy) = (|x| axes.sx(x), |y| axes.sy(y));
    let (plot_w, plot_h) = (axes.plot_w, axes.plot_h);
    let mut s = axes.open("allocated memory by category", x_label);
    let mut base = vec![0u64; xs.len()];
    for layer in layers {
        if layer.values.iter().all(|&v| v == 0) {
            continue;
        }
        let top: Vec<u64> = base
            .iter()
            .zip(layer.values.iter().chain(std::iter::repeat(&0)))
            .map(|(b, v)| b.saturating_add(*v))
            .collect();
        let _ = write!(
            s,
            r#"<polygon class="layer" fill="{}" fill-opacity=".8" stroke="{}" stroke-width=".5" points=""#,
            layer.colour, layer.colour
        );
        let upper = xs.iter().zip(&top).map(|(&x, &y)| (x, y));
        let lower = xs.iter().zip(&base).rev().map(|(&x, &y)| (x, y));
        for (k, (px, py)) in upper.chain(lower).enumerate() {
            if k > 0 {
                s.push(' ');
            }
            let _ = write!(s, "{:.1},{:.1}", sx(px as f64), sy(py as f64));
        }
        let _ = write!(s, r#""><title>{}</title></polygon>"#, escape(layer.name));
        base = top;
    }
    capacity_mark(&mut s, capacity, on_axis, sy);
    for (i, (at, label)) in marks.iter().enumerate() {
        let px = sx(*at as f64);
        let _ = write!(
            s,
            r##"<line class="oom" stroke="#1f2328" x1="{px:.1}" y1="{PAD_T}" x2="{px:.1}" y2="{:.1}"/><text class="oom-label" style="fill:#1f2328" x="{:.1}" y="{:.1}">{}</text>"##,
            PAD_T + plot_h,
            px - 4.0,
            PAD_T + 14.0 + 16.0 * i as f64,
            escape(label)
        );
    }
    let _ = write!(
        s,
        r#"<rect class="frame" x="{PAD_L}" y="{PAD_T}" width="{plot_w:.1}" height="{plot_h:.1}"/></svg>"#
    );
    s
}

const MAP_W: f64 = 1120.0;
const ROW_H: f64 = 26.0;
const ROW_GAP: f64 = 16.0;
const SEG_GAP: f64 = 6.0;
/// Segments drawn individually at most; the rest are summed in a note.
pub const MAX_MAP_SEGMENTS: usize = 600;

/// The segment map: segments sorted by size (largest first) laid out left
/// to right in rows, bytes to pixels on one scale; blocks coloured by state.
/// A segment longer than a row continues on the next. Returns the SVG and the
/// number of segments not drawn.
pub fn segment_map(map: &SegmentMap) -> (String, usize) {
    let mut order: Vec<usize> = (0..map.segments.len()).collect();
    order.sort_by_key(|&i| {
        std::cmp::Reverse(map.segments.get(i).map(|s| s.total_size()).unwrap_or(0))
    });
    let hidden = order.len().saturating_sub(MAX_MAP_SEGMENTS);
    order.truncate(MAX_MAP_SEGMENTS);
    let total: u64 = order
        .iter()
        .filter_map(|&i| map.segments.get(i))
        .map(|s| s.total_size())
        .sum();
    // Rows grow with the square root of the segment count, so a few segments
    // get one or two wide rows and hundreds get a dense block.
    let rows_target = ((order.len() as f64).sqrt().ceil()).clamp(1.0, 14.0);
    let usable = MAP_W * rows_target - SEG_GAP * order.len() as f64;
    let scale = if total == 0 {
        0.0
    } else {
        (usable.max(MAP_W) / total as f64).min(f64::MAX)
    };
    const MIN_W: f64 = 3.0;

    let mut body = String::with_capacity(32 * 1024);
    let (mut row, mut col) = (0usize, 0.0f64);
    for &i in &order {
        let Some(seg) = map.segments.get(i) else {
            continue;
        };
        let seg_total = seg.total_size();
        let w = (seg_total as f64 * scale).max(MIN_W);
        // Start a new row when the segment would not fit and is not longer than a row anyway.
        if col > 0.0 && col + w > MAP_W && w <= MAP_W {
            row += 1;
            col = 0.0;
        }
        let start_row = row;
        let start_col = col;
        // Places the byte range [a, b) of this segment (in pixels from its start) into
        // row-sized runs, calling `emit(x, y, width)` for each.
        let place = |a: f64, b: f64, emit: &mut dyn FnMut(f64, f64, f64)| {
            let mut pos = start_col + a;
            let end = start_col + b;
            let mut r = start_row;
            while pos >= MAP_W {
                pos -= MAP_W;
                r += 1;
            }
            let mut remaining = end - (start_col + a);
            while remaining > 0.01 {
                let run = remaining.min(MAP_W - pos);
                emit(pos, r as f64 * (ROW_H + ROW_GAP), run);
                remaining -= run;
                pos = 0.0;
                r += 1;
            }
        };
        let allocated: u64 = seg
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::Allocated)
            .map(|b| b.size)
            .sum();
        let tip = format!(
            "segment {:#x}: {}, {} allocated, stream {}",
            seg.address,
            human(seg_total),
            human(allocated),
            seg.stream
        );
        let tip = escape(&tip);
        body.push_str("<g class=\"seg\">");
        let _ = write!(body, "<title>{tip}</title>");
        place(0.0, w, &mut |x, y, run| {
            let _ = write!(
                body,
                r#"<rect class="free" x="{x:.1}" y="{y:.1}" width="{run:.1}" height="{ROW_H}"/>"#
            );
        });
        // Blocks: coalesce neighbours of the same state, draw the non-free ones.
        let mut offset = 0u64;
        let mut k = 0;
        while k < seg.blocks.len() {
            let state = seg.blocks[k].state;
            let start = offset;
            while k < seg.blocks.len() && seg.blocks[k].state == state {
                offset += seg.blocks[k].size;
                k += 1;
            }
            if state == BlockState::Free || seg_total == 0 {
                continue;
            }
            let a = start as f64 / seg_total as f64 * w;
            let b = offset as f64 / seg_total as f64 * w;
            let class = state.class();
            place(a, b.max(a + 0.6), &mut |x, y, run| {
                let _ = write!(
                    body,
                    r#"<rect class="{class}" x="{x:.1}" y="{y:.1}" width="{run:.1}" height="{ROW_H}"/>"#
                );
            });
        }
        if w >= 64.0 {
            let _ = write!(
                body,
                r#"<text class="seglabel" x="{:.1}" y="{:.1}">{}</text>"#,
                start_col + 4.0,
                start_row as f64 * (ROW_H + ROW_GAP) + ROW_H + 12.0,
                escape(&human(seg_total))
            );
        }
        body.push_str("</g>");
        // Advance the cursor past the segment (possibly several rows on).
        let mut end = start_col + w;
        while end > MAP_W {
            end -= MAP_W;
            row += 1;
        }
        col = end + SEG_GAP;
    }
    let height = (row + 1) as f64 * (ROW_H + ROW_GAP);
    let svg = format!(
        r#"<svg class="segmap" viewBox="0 0 {MAP_W} {height:.0}" role="img" aria-label="segment map" xmlns="http://www.w3.org/2000/svg">{body}</svg>"#
    );
    (svg, hidden)
}

/// The frontier of what fits (`fit` in two knobs): per config, the largest
/// value of one knob (up) that fits the card at each value of the other
/// (across), a dot per point.
pub fn frontier_chart(lines: &[SizeLine], (x_label, y_label): (&str, &str)) -> String {
    let max = |f: fn(&(u64, u64)) -> u64| {
        lines
            .iter()
            .flat_map(|l| l.points.iter().map(f))
            .max()
            .unwrap_or(1)
            .max(1) as f64
    };
    let axes = Axes::counts(max(|p| p.0), max(|p| p.1));
    let mut s = axes.open(
        &format!("the largest {y_label} that fits, by {x_label}"),
        x_label,
    );
    for l in lines {
        let colour = PALETTE[l.colour % PALETTE.len()];
        let _ = write!(
            s,
            r#"<polyline class="reserved" stroke="{colour}" points=""#
        );
        for (k, &(x, y)) in l.points.iter().enumerate() {
            if k > 0 {
                s.push(' ');
            }
            let _ = write!(s, "{:.1},{:.1}", axes.sx(x as f64), axes.sy(y as f64));
        }
        let _ = write!(s, r#""><title>{}</title></polyline>"#, escape(&l.name));
        for &(x, y) in &l.points {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"><title>{}: {y_label} {y} at {x_label} {x}</title></circle>"#,
                axes.sx(x as f64),
                axes.sy(y as f64),
                escape(&l.name),
            );
        }
    }
    let _ = write!(
        s,
        r#"<rect class="frame" x="{PAD_L}" y="{PAD_T}" width="{:.1}" height="{:.1}"/></svg>"#,
        axes.plot_w, axes.plot_h
    );
    s
}

/// One line of [`size_chart`]: bytes at each size.
pub struct SizeLine {
    pub name: String,
    pub points: Vec<(u64, u64)>,
    /// Allocated bytes (dashed), not reserved (solid).
    pub allocated: bool,
    /// Its colour's index in the palette (a config's allocated and reserved
    /// lines share it).
    pub colour: usize,
}

/// Predicted memory against the knob (`fit`): a line per config and
/// quantity, the recorded sizes and the largest fitting sizes marked as
/// vertical lines, the card's capacity as a line.
pub fn size_chart(
    lines: &[SizeLine],
    marks: &[(u64, String)],
    capacity: Option<u64>,
    x_label: &str,
) -> String {
    line_chart(
        lines,
        marks,
        capacity,
        ("predicted peak memory by size", x_label),
        true,
    )
}

/// [`size_chart`]'s drawing with its title and x axis named, and a dot per
/// point when `dots` (a run of thousands of steps draws lines only).
pub fn line_chart(
    lines: &[SizeLine],
    marks: &[(u64, String)],
    capacity: Option<u64>,
    (title, x_label): (&str, &str),
    dots: bool,
) -> String {
    let max_x = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .chain(marks.iter().map(|m| m.0))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let data_peak = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0);
    let (axes, on_axis) = Axes::new(max_x, data_peak, capacity);
    let (sx, sy) = (|x| axes.sx(x), |y| axes.sy(y));
    let mut s = axes.open(title, x_label);
    capacity_mark(&mut s, capacity, on_axis, sy);
    for (i, (x, label)) in marks.iter().enumerate() {
        let px = sx(*x as f64);
        let _ = write!(
            s,
            r##"<line class="oom" stroke="#868e96" x1="{px:.1}" y1="{PAD_T}" x2="{px:.1}" y2="{:.1}"/><text class="oom-label" style="fill:#495057" x="{:.1}" y="{:.1}">{}</text>"##,
            PAD_T + axes.plot_h,
            px - 4.0,
            PAD_T + 14.0 + 16.0 * i as f64,
            escape(label)
        );
    }
    for l in lines {
        let colour = PALETTE[l.colour % PALETTE.len()];
        let class = if l.allocated { "allocated" } else { "reserved" };
        let _ = write!(s, r#"<polyline class="{class}" stroke="{colour}" points=""#);
        for (k, &(x, y)) in l.points.iter().enumerate() {
            if k > 0 {
                s.push(' ');
            }
            let _ = write!(s, "{:.1},{:.1}", sx(x as f64), sy(y as f64));
        }
        let _ = write!(s, r#""><title>{}</title></polyline>"#, escape(&l.name));
        for &(x, y) in l.points.iter().filter(|_| dots) {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{colour}"><title>{}: {} at {x}</title></circle>"#,
                sx(x as f64),
                sy(y as f64),
                escape(&l.name),
                escape(&human(y))
            );
        }
    }
    let _ = write!(
        s,
        r#"<rect class="frame" x="{PAD_L}" y="{PAD_T}" width="{:.1}" height="{:.1}"/></svg>"#,
        axes.plot_w, axes.plot_h
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_keeps_every_extreme_in_bounded_points() {
        let mut env = Envelope::new();
        for i in 0..1_000_000u64 {
            // A sawtooth with one spike that must survive downsampling.
            let y = if i == 777_777 { 1 << 40 } else { i % 1000 };
            env.push(i, y);
        }
        let pts = env.points();
        assert!(pts.len() <= 2 * MAX_BUCKETS, "{} points", pts.len());
        assert!(pts.len() >= MAX_BUCKETS / 2);
        assert!(pts.contains(&(777_777, 1 << 40)));
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(env.peak(), 1 << 40);
        assert_eq!(env.last_x(), 999_999);
        assert!(env.is_downsampled());
        let band = env.band();
        assert!(band.len() <= MAX_BUCKETS);
        assert!(band.iter().any(|&(_, _, hi)| hi == 1 << 40));
        // Each full bucket spans 1024 points of the period-1000 sawtooth, so
        // it holds 0 and 999 (the last, partial bucket need not).
        let full = &band[..band.len() - 1];
        assert!(
            full.iter()
                .all(|&(_, lo, hi)| lo == 0 && (hi == 999 || hi == 1 << 40))
        );
    }

    #[test]
    fn envelope_of_few_points_is_exact() {
        let mut env = Envelope::new();
        for (x, y) in [(0, 5), (1, 9), (2, 3)] {
            env.push(x, y);
        }
        assert_eq!(env.points(), vec![(0, 5), (1, 9), (2, 3)]);
        assert!(!env.is_downsampled());
    }

    #[test]
    fn ticks_are_round_binary_sizes() {
        assert_eq!(
            byte_step(80.0 * 1024.0 * 1024.0 * 1024.0, 5.0),
            20.0 * (1u64 << 30) as f64
        );
        assert_eq!(size_label(1.5 * (1u64 << 30) as f64), "1.5 GiB");
        assert_eq!(decimal_step(1_000_000.0, 8.0), 200_000.0);
        assert_eq!(count_label(1_500_000.0), "1.5M");
    }
}
