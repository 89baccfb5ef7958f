//! `top`: what fills the card, as tables (text, Markdown), JSON and an HTML
//! page with the allocated memory stacked by category over the trace. The
//! moment tables are shared with `diagnose`'s "What fills the card" and `diff`.

use super::Format;
use super::common::{Grid, json};
use super::html::escape;
use crate::advise::fills::MustGo;
use crate::evidence::fills::{
    Attribution, Category, CategoryPart, Grouping, Moment, MomentKind, PreTrace, Row, Stacks,
};
use crate::units::human;
use serde::Serialize;
use std::fmt::Write;

/// `top --format json`.
#[derive(Serialize)]
struct Document<'a> {
    input: &'a str,
    devices: &'a [Attribution],
    #[serde(skip_serializing_if = "Option::is_none")]
    must_go: Option<MustGoOf<'a>>,
}

/// What must go on a device.
#[derive(Serialize)]
struct MustGoOf<'a> {
    device_index: u32,
    #[serde(flatten)]
    must_go: &'a MustGo,
}

pub fn render(
    input: &str,
    devices: &[Attribution],
    must_go: Option<&(u32, MustGo)>,
    format: Format,
) -> String {
    if format.is_json() {
        return json(&Document {
            input,
            devices,
            must_go: must_go.map(|(device_index, must_go)| MustGoOf {
                device_index: *device_index,
                must_go,
            }),
        });
    }
    let md = format == Format::Markdown;
    let mut s = String::new();
    for a in devices {
        let _ = writeln!(s, "{}", heading(input, a, md));
        for m in &a.moments {
            s.push('\n');
            s.push_str(&moment_text(m, md));
        }
        if !a.growth.is_empty() {
            s.push('\n');
            s.push_str(&grid_text(&growth_grid(a), md));
        }
        if let Some((_, g)) = must_go.filter(|(d, _)| *d == a.device_index) {
            s.push('\n');
            for l in must_go_lines(g) {
                let _ = writeln!(s, "{l}");
            }
        }
        if !a.notes.is_empty() {
            s.push('\n');
            for n in &a.notes {
                let _ = writeln!(s, "note: {n}");
            }
        }
        s.push('\n');
    }
    s
}

fn grid_text(g: &Grid, md: bool) -> String {
    if md { g.to_markdown() } else { g.to_text() }
}

/// The line naming the device and what its trace holds.
fn heading(input: &str, a: &Attribution, md: bool) -> String {
    let stacks = match a.stacks {
        Stacks::PythonAndCpp => "Python and C++ stacks",
        Stacks::Python => "Python stacks",
        Stacks::Cpp => "C++ stacks only",
        Stacks::None => "no stacks",
    };
    let what = if a.traced {
        format!(
            "{} trace entries, {}, {} step{}",
            a.trace_entries,
            stacks,
            a.steps,
            if a.steps == 1 { "" } else { "s" }
        )
    } else {
        format!("no recorded allocations, {stacks}: the state at the end only")
    };
    let line = format!("What fills cuda:{} in {input}: {what}", a.device_index);
    if md { format!("## {line}") } else { line }
}

/// The per-rank view: a row per rank, the imbalance, then the outlier's table.
pub fn render_ranks(
    ranks: &crate::evidence::fills::Ranks,
    inputs: &[(String, Attribution)],
    format: Format,
) -> String {
    #[derive(Serialize)]
    struct Doc<'a> {
        ranks: &'a crate::evidence::fills::Ranks,
        inputs: Vec<Input<'a>>,
    }
    #[derive(Serialize)]
    struct Input<'a> {
        input: &'a str,
        device: &'a Attribution,
    }
    if format.is_json() {
        return json(&Doc {
            ranks,
            inputs: inputs
                .iter()
                .map(|(input, device)| Input { input, device })
                .collect(),
        });
    }
    let md = format == Format::Markdown;
    let mut g = Grid::new(
        format!(
            "What fills the card, per rank ({} inputs)",
            ranks.rows.len()
        ),
        &[
            "rank",
            "input",
            "at",
            "allocated",
            "reserved",
            "top site",
            "top category",
            "flag",
        ],
    )
    .numeric(&[3, 4]);
    for r in &ranks.rows {
        g.row(vec![
            r.rank.map_or_else(|| "—".to_string(), |k| k.to_string()),
            format!("{} (cuda:{})", r.input, r.device_index),
            r.moment.as_str().to_string(),
            human(r.allocated_bytes),
            human(r.reserved_bytes),
            match (&r.top_site, r.top_site_bytes) {
                (Some(s), Some(b)) => format!("{s} ({})", human(b)),
                _ => String::new(),
            },
            r.top_category.map_or("", |c| c.label()).to_string(),
            if r.outlier {
                "outlier".to_string()
            } else {
                String::new()
            },
        ]);
    }
    let mut s = grid_text(&g, md);
    let _ = writeln!(
        s,
        "Imbalance: the fullest holds {:.2}× what the emptiest holds.",
        ranks.imbalance
    );
    let outlier = ranks
        .outlier_input
        .as_ref()
        .and_then(|o| inputs.iter().find(|(i, _)| i == o));
    match outlier {
        Some((input, a)) => {
            let _ = writeln!(
                s,
                "Out of balance: {} (off the median by more than 10 % and 256 MiB).",
                ranks
                    .outlier_rank
                    .map_or_else(|| input.clone(), |k| format!("rank {k} ({input})"))
            );
            if let Some(m) = a.headline() {
                s.push('\n');
                s.push_str(&moment_text(m, md));
            }
        }
        None => {
            let _ = writeln!(
                s,
                "No rank is off the median by more than 10 % and 256 MiB."
            );
        }
    }
    s
}

/// `diff`: the two sides' totals, then the groups and categories with the largest change.
pub fn render_diff(d: &crate::evidence::fills::Diff, format: Format) -> String {
    if format.is_json() {
        return json(d);
    }
    let md = format == Format::Markdown;
    let signed = |v: i64| {
        if v < 0 {
            format!("−{}", human(v.unsigned_abs()))
        } else {
            format!("+{}", human(v.unsigned_abs()))
        }
    };
    let delta = |a: u64, b: u64| {
        signed(
            (i128::from(b) - i128::from(a)).clamp(i128::from(i64::MIN), i128::from(i64::MAX))
                as i64,
        )
    };
    let (b, a) = (&d.before, &d.after);
    let mut t = Grid::new(
        format!("Compared at the {} of each side", b.moment.as_str()),
        &["", "before", "after", "change"],
    )
    .numeric(&[1, 2, 3]);
    let event = |s: &crate::evidence::fills::Side| {
        s.event_index
            .map_or_else(|| "—".to_string(), |e| e.to_string())
    };
    t.row(vec![
        "input".into(),
        b.input.clone(),
        a.input.clone(),
        String::new(),
    ]);
    t.row(vec!["event".into(), event(b), event(a), String::new()]);
    for (label, x, y) in [
        ("allocated", b.allocated_bytes, a.allocated_bytes),
        ("reserved", b.reserved_bytes, a.reserved_bytes),
        (
            "live before the trace",
            b.pre_trace_bytes,
            a.pre_trace_bytes,
        ),
    ] {
        t.row(vec![label.into(), human(x), human(y), delta(x, y)]);
    }
    if let (Some(x), Some(y)) = (b.peak_allocated_bytes, a.peak_allocated_bytes) {
        t.row(vec![
            "peak allocated".into(),
            human(x),
            human(y),
            delta(x, y),
        ]);
    }
    let rows = |title: String,
                list: &[crate::evidence::fills::DiffRow],
                rest: Option<&crate::evidence::fills::DiffRow>,
                category_names: bool| {
        let first = if category_names {
            "category"
        } else {
            by_label(d.by)
        };
        let mut g = Grid::new(
            title,
            &[first, "category", "before", "after", "change", "count"],
        )
        .numeric(&[2, 3, 4, 5]);
        let listed = list.iter().map(|r| (r, false));
        for (r, summed) in listed.chain(rest.map(|r| (r, true))) {
            let key = if category_names {
                Category::from_name(&r.key).map_or(r.key.clone(), |c| c.label().to_string())
            } else {
                r.key.clone()
            };
            g.row(vec![
                key,
                if category_names || summed {
                    super::common::ABSENT.to_string()
                } else {
                    category_cell(r.category, &r.mix)
                },
                human(r.before_bytes),
                human(r.after_bytes),
                signed(r.delta_bytes),
                format!("{} → {}", r.before_count, r.after_count),
            ]);
        }
        g.drop_empty_columns()
    };
    let mut s = grid_text(&t, md);
    // What each side's figure holds, as `top` says it under its table.
    for (which, side) in [("before", b), ("after", a)] {
        if let Some(figures) = pre_trace_figures(&side.pre_trace) {
            if md {
                s.push('\n');
            }
            let _ = writeln!(s, "Live before the trace began, {which}: {figures}.");
        }
    }
    s.push('\n');
    s.push_str(&grid_text(
        &rows(
            "By the largest change".to_string(),
            &d.rows,
            d.rest.as_ref(),
            d.by == Grouping::Category,
        ),
        md,
    ));
    if d.by != Grouping::Category {
        s.push('\n');
        s.push_str(&grid_text(
            &rows("By category".to_string(), &d.categories, None, true),
            md,
        ));
    }
    for n in &d.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

/// What a moment is, in words: "At the peak (event 1402)".
pub fn moment_title(m: &Moment) -> String {
    let at = |what: &str| match m.event_index {
        Some(i) => format!("{what} (event {i})"),
        None => what.to_string(),
    };
    match m.moment {
        MomentKind::Peak if m.event_index.is_none() => {
            "At the peak of allocated memory, before the trace's first entry".to_string()
        }
        MomentKind::Peak => at("At the peak of allocated memory"),
        MomentKind::Oom => {
            let request = m
                .request_bytes
                .map(|r| {
                    format!(
                        ", a request of {} with {} free on the device",
                        human(r),
                        human(m.device_free_bytes.unwrap_or(0))
                    )
                })
                .unwrap_or_default();
            format!("{}{request}", at("At the OOM"))
        }
        MomentKind::End if m.event_index.is_none() => "In the snapshot".to_string(),
        MomentKind::End => at("At the end of the trace"),
        MomentKind::Event => match m.event_index {
            Some(i) => format!("After event {i}"),
            None => "Before the trace".to_string(),
        },
        MomentKind::Time => at("At the time asked for"),
    }
}

/// The moment's title with its totals.
pub fn moment_headline(m: &Moment) -> String {
    format!(
        "{}: {} allocated in {} allocation{}, {} reserved",
        moment_title(m),
        human(m.allocated_bytes),
        m.live_allocations,
        if m.live_allocations == 1 { "" } else { "s" },
        human(m.reserved_bytes)
    )
}

/// A group's category as its cell in every table: the category, or, when
/// its allocations fall in several, "mixed:" with each one's part of its
/// bytes, so that no row names one category for memory of several. A part
/// a line, so the column stays narrow in a terminal (Markdown and HTML
/// read the line breaks as spaces).
pub fn category_cell(category: Category, mix: &[CategoryPart]) -> String {
    if mix.is_empty() {
        return category.label().to_string();
    }
    let total = mix.iter().map(|p| p.bytes).fold(0u64, u64::saturating_add);
    let parts: Vec<String> = mix
        .iter()
        .map(|p| {
            let share = if total == 0 {
                0.0
            } else {
                p.bytes as f64 / total as f64
            };
            // A sliver is not "0.0 %": it is there.
            let share = if p.bytes > 0 && share < 0.0005 {
                "<0.1 %".to_string()
            } else {
                percent(share)
            };
            format!("{} {share}", p.category.label())
        })
        .collect();
    format!("mixed:\n{}", parts.join(",\n"))
}

/// A share as a percentage with one decimal.
pub fn percent(share: f64) -> String {
    format!("{:.1} %", share * 100.0)
}

fn by_label(by: Grouping) -> &'static str {
    match by {
        Grouping::Site => "site",
        Grouping::User => "your code",
        Grouping::Stack => "stack (innermost first)",
        Grouping::Category => "category",
        Grouping::Size => "block size",
        Grouping::Segment => "segment",
    }
}

fn row_key(r: &Row, by: Grouping) -> String {
    match by {
        Grouping::Stack if !r.frames.is_empty() => r.frames.join(" ← "),
        Grouping::Category => {
            Category::from_name(&r.key).map_or(r.key.clone(), |c| c.label().to_string())
        }
        _ => r.key.clone(),
    }
}

/// The rows of a moment, at most `limit` of them, then the rest summed.
pub fn moment_grid(m: &Moment, limit: usize) -> Grid {
    let rounded = m.rows.iter().any(|r| r.block_bytes != r.bytes);
    let pre_column = m
        .rows
        .iter()
        .any(|r| r.pre_trace_bytes > 0 && r.key != crate::snapshot::attribute::PRE_TRACE_ROW);
    let categorised = m.by != Grouping::Category
        && m.rows
            .iter()
            .any(|r| r.category != Category::Unknown || !r.mix.is_empty());
    let mut header = vec![by_label(m.by)];
    if categorised {
        header.push("category");
    }
    header.extend(["bytes", "count", "share"]);
    if rounded {
        header.push("as blocks");
    }
    if pre_column {
        header.push("before the trace");
    }
    let first_number = header.len() - 3 - usize::from(rounded) - usize::from(pre_column);
    let mut g = Grid::new(moment_headline(m), &header)
        .numeric(&(first_number..header.len()).collect::<Vec<_>>());
    let mut line = |key: String,
                    cat: Option<String>,
                    bytes: u64,
                    count: u64,
                    share: f64,
                    block: u64,
                    pre: Option<u64>| {
        let mut cells = vec![key];
        if categorised {
            cells.push(cat.unwrap_or_default());
        }
        cells.extend([human(bytes), count.to_string(), percent(share)]);
        if rounded {
            cells.push(human(block));
        }
        if pre_column {
            cells.push(pre.map_or(String::new(), human));
        }
        g.row(cells);
    };
    // The first `limit` rows, and the pre-trace row wherever it ranks.
    let pre = crate::snapshot::attribute::PRE_TRACE_ROW;
    let keep = |(i, r): &(usize, &Row)| *i < limit.max(1) || r.key == pre;
    let shown: Vec<&Row> = m
        .rows
        .iter()
        .enumerate()
        .filter(keep)
        .map(|(_, r)| r)
        .collect();
    let cut: Vec<&Row> = m
        .rows
        .iter()
        .enumerate()
        .filter(|x| !keep(x))
        .map(|(_, r)| r)
        .collect();
    for r in &shown {
        line(
            row_key(r, m.by),
            Some(category_cell(r.category, &r.mix)),
            r.bytes,
            r.count,
            r.share,
            r.block_bytes,
            Some(r.pre_trace_bytes).filter(|&p| p > 0),
        );
    }
    let (mut groups, mut bytes, mut count, mut block) = (0u64, 0u64, 0u64, 0u64);
    for r in &cut {
        groups += 1;
        bytes += r.bytes;
        count += r.count;
        block += r.block_bytes;
    }
    if let Some(rest) = &m.rest {
        groups += rest.groups;
        bytes += rest.bytes;
        count += rest.count;
        block += rest.block_bytes;
    }
    if groups > 0 {
        let share = if m.allocated_bytes == 0 {
            0.0
        } else {
            bytes as f64 / m.allocated_bytes as f64
        };
        let what = match m.by {
            Grouping::Category => "categories",
            Grouping::Size => "size classes",
            Grouping::Segment => "segments",
            Grouping::Stack => "stacks",
            _ => "sites",
        };
        let what = match (groups, what) {
            (1, "size classes") => "size class",
            (1, w) => w.trim_end_matches('s'),
            (_, w) => w,
        };
        line(
            format!("{groups} other {what}"),
            None,
            bytes,
            count,
            share,
            block,
            None,
        );
    }
    g
}

/// Memory live before the trace began, in figures: the total, its share,
/// and what it holds (a part may be shown by site, so the
/// `<live before the trace began>` row can be less); `None` when there is none.
pub fn pre_trace_figures(p: &PreTrace) -> Option<String> {
    if p.bytes == 0 {
        return None;
    }
    let mut parts = Vec::new();
    if p.live_at_end_bytes > 0 {
        parts.push(format!(
            "{} still live at the end",
            human(p.live_at_end_bytes)
        ));
    }
    if p.freed_in_trace_bytes > 0 {
        parts.push(format!(
            "{} freed later in the trace",
            human(p.freed_in_trace_bytes)
        ));
    }
    if p.with_stack_bytes > 0 {
        parts.push(format!(
            "{} of it in blocks with a recorded stack, shown by site",
            human(p.with_stack_bytes)
        ));
    }
    Some(format!(
        "{}, {} of what is allocated ({} allocation{}): {}",
        human(p.bytes),
        percent(p.share),
        p.count,
        if p.count == 1 { "" } else { "s" },
        parts.join(", ")
    ))
}

/// The lines under a moment's table: pre-trace memory, free reserved
/// memory, the categories.
pub fn moment_lines(m: &Moment) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(figures) = pre_trace_figures(&m.pre_trace) {
        out.push(format!("Live before the trace began: {figures}."));
    }
    let f = &m.free_reserved;
    if m.reserved_bytes > 0 {
        out.push(format!(
            "Reserved but free: {} in segments that hold live blocks (fragmentation), {} in {} whole free segment{}.",
            human(f.in_split_segments_bytes),
            human(f.whole_free_segments_bytes),
            f.whole_free_segments,
            if f.whole_free_segments == 1 { "" } else { "s" }
        ));
    }
    if m.outside_segments_bytes > 0 {
        out.push(format!(
            "{} of the live allocations lie outside every segment the snapshot records at this moment: the trace and the segments disagree, and the figures follow the trace.",
            human(m.outside_segments_bytes)
        ));
    }
    let known = m.categories.iter().any(|c| c.category != Category::Unknown);
    if m.by != Grouping::Category && known {
        let cats: Vec<String> = m
            .categories
            .iter()
            .map(|c| {
                format!(
                    "{} {} ({})",
                    c.category.label(),
                    human(c.bytes),
                    percent(c.share)
                )
            })
            .collect();
        out.push(format!("By category: {}.", cats.join(" · ")));
    }
    out
}

fn moment_text(m: &Moment, md: bool) -> String {
    let g = moment_grid(m, usize::MAX);
    let mut s = if m.rows.is_empty() {
        format!("{}.\n", g.title)
    } else {
        grid_text(&g, md)
    };
    for l in moment_lines(m) {
        if md {
            s.push('\n');
        }
        s.push_str(&l);
        s.push('\n');
    }
    s
}

fn growth_grid(a: &Attribution) -> Grid {
    let mut g = Grid::new(
        "Growing every step (live bytes at the start of each step)",
        &["site", "category", "per step", "steps", "from", "to"],
    )
    .numeric(&[2, 4, 5]);
    for x in &a.growth {
        g.row(vec![
            x.site.clone(),
            category_cell(x.category, &x.mix),
            human(x.bytes_per_step),
            format!("{}–{}", x.first_step, x.last_step),
            human(x.first_bytes),
            human(x.last_bytes),
        ]);
    }
    g
}

/// The "What fills the card" section of `diagnose` (text or Markdown).
pub fn fills_text(f: &crate::advise::fills::Fills, md: bool) -> String {
    let mut s = String::new();
    if let Some(m) = &f.moment {
        let mut g = moment_grid(m, crate::advise::fills::DIAGNOSE_ROWS);
        g.title = format!(
            "What fills the card{}: {}",
            f.device_index
                .map_or(String::new(), |d| format!(" (cuda:{d})")),
            lower_first(&moment_headline(m))
        );
        if m.rows.is_empty() {
            let _ = writeln!(s, "{}.", g.title);
        } else {
            s.push_str(&grid_text(&g, md));
        }
        for l in moment_lines(m) {
            let _ = writeln!(s, "{l}");
        }
        for g in f.growth.iter().take(3) {
            let _ = writeln!(
                s,
                "Grows every step: {} by {} a step over steps {}–{} ({} → {}).",
                g.site,
                human(g.bytes_per_step),
                g.first_step,
                g.last_step,
                human(g.first_bytes),
                human(g.last_bytes)
            );
        }
    }
    if let Some(g) = &f.must_go {
        for l in must_go_lines(g) {
            let _ = writeln!(s, "{l}");
        }
    }
    if let Some(n) = &f.late_oom {
        let _ = writeln!(s, "A run, not a step: {n}.");
    }
    match &f.input {
        Some(input) => {
            let _ = writeln!(s, "Every site and moment: allocdoc top {input}");
        }
        None => {
            let _ = writeln!(
                s,
                "A snapshot would show which code holds it: {}",
                crate::snapshot::attribute::RECORD_STACKS
            );
        }
    }
    s
}

/// The "What fills the card" section as report tables (diagnose's HTML).
pub fn fills_tables(f: &crate::advise::fills::Fills) -> Vec<super::html::Table> {
    let mut lines = Vec::new();
    let mut out = Vec::new();
    if let Some(m) = &f.moment {
        lines.extend(moment_lines(m));
        let mut t =
            super::html::Table::of_grid(&moment_grid(m, crate::advise::fills::DIAGNOSE_ROWS), &[]);
        t.title = format!("What fills the card: {}", lower_first(&moment_headline(m)));
        out.push(t);
    }
    if let Some(g) = &f.must_go {
        lines.extend(must_go_lines(g));
    }
    match out.last_mut() {
        Some(t) => t.note = Some(lines.join(" ")),
        None => out.push(super::html::Table {
            title: "What must go".into(),
            headers: vec!["".into()],
            rows: lines
                .into_iter()
                .map(|l| super::html::TableRow {
                    cells: vec![l],
                    flag: None,
                })
                .collect(),
            note: None,
        }),
    }
    out
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_lowercase().chain(c).collect())
        .unwrap_or_default()
}

/// What must go, in sentences: the shortfall, then each lever with the figure behind it.
pub fn must_go_lines(g: &crate::advise::fills::MustGo) -> Vec<String> {
    let mut out = Vec::new();
    if g.spilled_bytes > 0 {
        out.push(format!(
            "What must go: at least {} of the {} live ({}): PyTorch reserved {} more than the card holds (the driver spilled it into shared system memory), and the cache and the request of {} must fit on the card.",
            human(g.shortfall_bytes),
            human(g.allocated_bytes),
            percent(g.share_of_allocated),
            human(g.spilled_bytes),
            human(g.request_bytes)
        ));
    } else if g.shortfall_bytes == 0 {
        out.push(format!(
            "What must go cannot be bounded from these figures: the request of {} would fit in the {} free on the device and the {} reserved but free together (before it fails, the allocator gives back only whole free segments, so what stays is split between live tensors); room for the allocations after it is what must be freed.",
            human(g.request_bytes),
            human(g.device_free_bytes),
            human(g.reserved_free_bytes)
        ));
    } else {
        out.push(format!(
            "What must go: at least {} of the {} live ({}): the request of {} is that much more than the {} free on the device and the {} reserved but free together.",
            human(g.shortfall_bytes),
            human(g.allocated_bytes),
            percent(g.share_of_allocated),
            human(g.request_bytes),
            human(g.device_free_bytes),
            human(g.reserved_free_bytes)
        ));
    }
    for c in &g.smallest_card {
        out.push(match c.capacity_bytes {
            Some(b) => format!(
                "The smallest card this trace runs on under the {} config ({}): {}.",
                c.config,
                if c.conf.is_empty() { "PyTorch's defaults" } else { &c.conf },
                human(b)
            ),
            None => format!(
                "Under the {} config ({}) the trace runs out of memory on every card up to the one bisected from.",
                c.config,
                if c.conf.is_empty() { "PyTorch's defaults" } else { &c.conf }
            ),
        });
    }
    let mut last = None;
    for l in &g.levers {
        if last != Some(l.category) {
            last = Some(l.category);
            out.push(if l.category == Category::Unknown {
                format!(
                    "{} ({} of live memory) cannot be told apart by category; first:",
                    human(l.bytes),
                    percent(l.share)
                )
            } else {
                format!(
                    "The largest category, {}, holds {} ({} of live memory); what cuts it:",
                    l.category.label(),
                    human(l.bytes),
                    percent(l.share)
                )
            });
        }
        out.push(format!("  - {}", l.lever));
    }
    if let Some(r) = &g.fit_recipe {
        out.push(format!("Next: {r}."));
    }
    out
}

/// Category colours of the HTML timeline, in [`Category::ALL`] order.
const CATEGORY_COLOURS: [&str; 7] = [
    "#1971c2", "#2f9e44", "#9c36b5", "#e67700", "#f59f00", "#c2255c", "#868e96",
];

/// The HTML page: per device, the timeline stacked by category (peak and
/// OOM marked), then the moment tables.
pub fn html(input: &str, devices: &[Attribution], must_go: Option<&(u32, MustGo)>) -> String {
    use super::html::{ReportData, Table, TableRow};
    let mut data = ReportData {
        title: format!("What fills the card: {input}"),
        subtitle: Some(format!("allocdoc top {input}")),
        ..Default::default()
    };
    data.verdict.headline = devices
        .iter()
        .find_map(|a| a.headline())
        .map(moment_headline)
        .unwrap_or_else(|| "Nothing was allocated.".to_string());
    for a in devices {
        let title = heading(input, a, false);
        let chart = timeline_html(a);
        if !chart.is_empty() {
            data.charts.push((
                format!("Allocated memory by category, cuda:{}", a.device_index),
                chart,
            ));
        }
        for m in &a.moments {
            let mut t = Table::of_grid(&moment_grid(m, usize::MAX), &moment_lines(m));
            t.title = format!("cuda:{}: {}", a.device_index, t.title);
            data.tables.push(t);
        }
        if !a.growth.is_empty() {
            data.tables.push(Table::of_grid(&growth_grid(a), &[]));
        }
        if let Some((_, g)) = must_go.filter(|(d, _)| *d == a.device_index) {
            data.tables.push(Table {
                title: format!("What must go, cuda:{}", a.device_index),
                headers: vec!["".into()],
                rows: must_go_lines(g)
                    .into_iter()
                    .map(|l| TableRow {
                        cells: vec![l],
                        flag: None,
                    })
                    .collect(),
                note: None,
            });
        }
        if !a.notes.is_empty() {
            data.tables.push(Table {
                title: format!("Notes: {title}"),
                headers: vec!["note".into()],
                rows: a
                    .notes
                    .iter()
                    .map(|n| TableRow {
                        cells: vec![n.clone()],
                        flag: None,
                    })
                    .collect(),
                note: None,
            });
        }
    }
    super::html::render(&data)
}

/// The stacked timeline of one device, with its legend.
fn timeline_html(a: &Attribution) -> String {
    let points = &a.timeline.points;
    if points.len() < 2 {
        return String::new();
    }
    let xs: Vec<u64> = points.iter().map(|p| p.0).collect();
    let layers: Vec<super::svg::Layer> = Category::ALL
        .iter()
        .zip(CATEGORY_COLOURS)
        .map(|(c, colour)| super::svg::Layer {
            name: c.label(),
            colour,
            values: points
                .iter()
                .map(|p| p.1.get(c.index()).copied().unwrap_or(0))
                .collect(),
        })
        .collect();
    let marks: Vec<(u64, String)> = a
        .moments
        .iter()
        .filter(|m| matches!(m.moment, MomentKind::Peak | MomentKind::Oom))
        .filter_map(|m| {
            let what = if m.moment == MomentKind::Peak {
                "peak"
            } else {
                "OOM"
            };
            Some((
                m.event_index?,
                format!(
                    "{what} at event {}: {}",
                    m.event_index?,
                    human(m.allocated_bytes)
                ),
            ))
        })
        .collect();
    let mut s = String::from("<div class=\"timeline\">");
    s.push_str(&super::svg::stacked_chart(
        &xs,
        &layers,
        &marks,
        None,
        "trace entry",
    ));
    s.push_str("<div class=\"legend\">");
    for l in layers.iter().filter(|l| l.values.iter().any(|&v| v > 0)) {
        let _ = write!(
            s,
            "<span><i class=\"box\" style=\"background:{}\"></i>{}</span>",
            l.colour,
            escape(l.name)
        );
    }
    s.push_str("</div></div>");
    s
}
