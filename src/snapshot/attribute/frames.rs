//! What a frame shows (Python or C++, torch, the standard library, a
//! package; which category rules it meets) and what a stack shows (its
//! site, user site and rule class), each classified once; the categories'
//! rules (docs/ATTRIBUTION.md).

use super::{Attributor, SITE_NO_PYTHON, Stacks, index32, push};
use crate::evidence::fills::Category;
use crate::snapshot::model::{Frame, Frames};
use crate::snapshot::pickle::V;

/// The rule class of a stack, in the order the rules are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Optimizer,
    Backward,
    Parameters,
    Forward,
    Unknown,
}

// What one frame shows, as bits.
pub(crate) const PY: u16 = 1;
const TORCH: u16 = 1 << 1;
const STDLIB: u16 = 1 << 2;
const PACKAGE: u16 = 1 << 3;
const OPTIM: u16 = 1 << 4;
const BACKWARD: u16 = 1 << 5;
const ACCUMULATE: u16 = 1 << 6;
const PARAM: u16 = 1 << 7;
const FORWARD: u16 = 1 << 8;
/// Code torch.compile generated (Inductor's output modules, named by a hash
/// of their source): a new shape can compile another module with another
/// hash and other lines, so neither names a site; the user's frame that
/// called into the compiled graph does.
pub(crate) const GENERATED: u16 = 1 << 9;
/// Not a frame dict: skipped.
pub(super) const SKIP: u16 = 1 << 15;

/// A frame's verdict, cached per frame dict.
#[derive(Clone, Copy)]
pub(super) struct FrameInfo {
    pub(super) flags: u16,
    /// Interned site of a Python frame.
    pub(super) site: u32,
}

/// A stack's verdict, cached per frames list.
#[derive(Clone, Copy)]
pub(super) struct StackInfo {
    pub(super) site: u32,
    pub(super) user: u32,
    pub(super) class: Class,
    pub(super) accumulate: bool,
    pub(super) python: bool,
    pub(super) cpp: bool,
}

/// A frame's site key: borrowed from the snapshot's strings.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct SiteKey<'s> {
    pub(super) filename: &'s str,
    pub(super) line: i64,
    pub(super) name: &'s str,
}

impl<'s, 'a> Attributor<'s, 'a> {
    /// The stack id of a frames list, classified on first sight.
    pub(super) fn stack_of(&mut self, f: Frames) -> u32 {
        if f == Frames::NONE {
            return 0;
        }
        if let Some(&s) = self.lists.get(&f.0) {
            return s;
        }
        let snap = self.snap;
        let (mut site, mut user, mut first_py) = (None, None, None);
        let (mut all, mut any, mut cpp) = (0u16, false, false);
        for &fr in snap.frame_list(f) {
            let info = self.frame_info(fr);
            if info.flags & SKIP != 0 {
                continue;
            }
            any = true;
            cpp |= info.flags & PY == 0;
            all |= info.flags;
            if info.flags & PY != 0 {
                first_py.get_or_insert(info.site);
                if info.flags & (TORCH | STDLIB | GENERATED) == 0 {
                    site.get_or_insert(info.site);
                    if info.flags & PACKAGE == 0 {
                        user.get_or_insert(info.site);
                    }
                }
            }
        }
        if !any {
            // An empty list: recorded without a stack.
            self.lists.insert(f.0, 0);
            return 0;
        }
        let fallback = first_py.unwrap_or(SITE_NO_PYTHON);
        let site = site.unwrap_or(fallback);
        let info = StackInfo {
            site,
            user: user.unwrap_or(site),
            class: class_of(all),
            accumulate: all & ACCUMULATE != 0,
            python: all & PY != 0,
            cpp,
        };
        let id = index32(self.stacks.len());
        if push(&mut self.stacks, info) && push(&mut self.stack_frames, f) {
            self.lists.insert(f.0, id);
            id
        } else {
            self.fed.refused = true;
            0
        }
    }

    fn frame_info(&mut self, fr: V) -> FrameInfo {
        let Some(id) = fr.id() else {
            return FrameInfo {
                flags: SKIP,
                site: 0,
            };
        };
        if let Some(&info) = self.frames.get(&id) {
            return info;
        }
        let info = match self.snap.frame_at(fr) {
            None => FrameInfo {
                flags: SKIP,
                site: 0,
            },
            Some(frame) => {
                let flags = frame_flags(frame.filename, frame.name);
                let site = if flags & PY != 0 {
                    self.intern(SiteKey {
                        filename: frame.filename,
                        line: frame.line,
                        name: frame.name,
                    })
                } else {
                    0
                };
                FrameInfo { flags, site }
            }
        };
        self.frames.insert(id, info);
        info
    }

    fn intern(&mut self, key: SiteKey<'s>) -> u32 {
        if let Some(&id) = self.site_ids.get(&key) {
            return id;
        }
        let id = index32(self.sites.len());
        if push(&mut self.sites, key) {
            self.site_ids.insert(key, id);
            id
        } else {
            self.fed.refused = true;
            SITE_NO_PYTHON
        }
    }

    pub(super) fn accumulates(&self, stack: u32) -> bool {
        self.stacks
            .get(stack as usize)
            .is_some_and(|s| s.accumulate)
    }

    pub(super) fn stacks_recorded(&self) -> Stacks {
        let used = |f: &dyn Fn(&StackInfo) -> bool| self.stacks.iter().skip(2).any(f);
        match (used(&|s| s.python), used(&|s| s.cpp)) {
            (true, true) => Stacks::PythonAndCpp,
            (true, false) => Stacks::Python,
            (false, true) => Stacks::Cpp,
            (false, false) => Stacks::None,
        }
    }
}

/// The category of a rule class; `outlives`: the allocation outlives its phase.
pub(super) fn category(class: Class, accumulate: bool, outlives: bool) -> Category {
    match class {
        Class::Optimizer if outlives => Category::OptimizerState,
        Class::Optimizer => Category::OptimizerTemporaries,
        Class::Backward if accumulate || outlives => Category::Gradients,
        Class::Backward => Category::BackwardTemporaries,
        Class::Parameters => Category::Parameters,
        Class::Forward => Category::Activations,
        Class::Unknown => Category::Unknown,
    }
}

fn class_of(flags: u16) -> Class {
    if flags & OPTIM != 0 {
        Class::Optimizer
    } else if flags & BACKWARD != 0 {
        Class::Backward
    } else if flags & PARAM != 0 {
        Class::Parameters
    } else if flags & FORWARD != 0 {
        Class::Forward
    } else {
        Class::Unknown
    }
}

/// The verdict on one frame: where its file lives and which category rules it meets.
pub(crate) fn frame_flags(filename: &str, name: &str) -> u16 {
    let normalised;
    let path = if filename.contains('\\') {
        normalised = filename.replace('\\', "/");
        normalised.as_str()
    } else {
        filename
    };
    let mut f = 0;
    let py = path.ends_with(".py");
    let package = path.contains("/site-packages/") || path.contains("/dist-packages/");
    let is = |tail: &str| path == tail || path.strip_suffix(tail).is_some_and(|p| p.ends_with('/'));
    if py {
        f |= PY;
        if path.contains("/torch/") || path.starts_with("torch/") {
            f |= TORCH;
        }
        if is_generated(path) {
            f |= GENERATED;
        }
        if package {
            f |= PACKAGE;
        } else if is_stdlib(path) {
            f |= STDLIB;
        }
    }
    const OPTIMIZER_DIRS: [&str; 6] = [
        "/torch/optim/",
        "/torch/distributed/optim/",
        "/apex/optimizers/",
        "/bitsandbytes/optim/",
        "/deepspeed/ops/adam/",
        "/torchao/optim/",
    ];
    if (py
        && (OPTIMIZER_DIRS.iter().any(|d| path.contains(d)) || is("transformers/optimization.py")))
        || (name == "step" && path.to_ascii_lowercase().contains("optim"))
    {
        f |= OPTIM;
    }
    let backward = match name {
        "backward" => is("torch/_tensor.py") || is("torch/autograd/__init__.py"),
        "grad" => is("torch/autograd/__init__.py"),
        "_engine_run_backward" => is("torch/autograd/graph.py"),
        _ => false,
    };
    if backward
        || (!py && (name.contains("torch::autograd::Engine::") || name.contains("AccumulateGrad")))
    {
        f |= BACKWARD;
    }
    if !py && name.contains("AccumulateGrad") {
        f |= ACCUMULATE;
    }
    const PARAM_FUNCTIONS: [&str; 6] = [
        "__init__",
        "reset_parameters",
        "_apply",
        "to",
        "cuda",
        "_load_from_state_dict",
    ];
    if (path.contains("/torch/nn/") && PARAM_FUNCTIONS.contains(&name))
        || name.contains("load_state_dict")
        || name.contains("from_pretrained")
        || name == "_load_pretrained_model"
        || is("torch/nn/parameter.py")
    {
        f |= PARAM;
    }
    if name == "forward"
        || (is("torch/nn/modules/module.py") && matches!(name, "_call_impl" | "_wrapped_call_impl"))
    {
        f |= FORWARD;
    }
    f
}

/// A module torch.compile's Inductor wrote: `c` and 51 base32 characters
/// of a hash of its source (`torch/_inductor/codecache.py`, `code_hash`),
/// or any `.py` under its default cache directory `/tmp/torchinductor_<user>`.
fn is_generated(path: &str) -> bool {
    if path.contains("/torchinductor_") {
        return true;
    }
    let base = path.rsplit('/').next().unwrap_or("");
    base.strip_suffix(".py")
        .and_then(|b| b.strip_prefix('c'))
        .is_some_and(|h| {
            h.len() == 51
                && h.bytes()
                    .all(|c| c.is_ascii_lowercase() || (b'2'..=b'7').contains(&c))
        })
}

/// A file of the Python standard library: under `lib/pythonX.Y/` (or
/// Windows' `Lib/`) and not in site-packages (checked by the caller).
fn is_stdlib(path: &str) -> bool {
    if path.contains("/Lib/") {
        return true;
    }
    ["/lib/python", "/lib64/python", "/Lib/python"]
        .iter()
        .any(|dir| {
            path.match_indices(dir).any(|(at, _)| {
                let rest = path.get(at + dir.len()..).unwrap_or("");
                let version = rest.len()
                    - rest
                        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                        .len();
                rest.get(version..).is_some_and(|r| r.starts_with('/'))
            })
        })
}

/// How a site's file is shown: the path inside site-packages, else the file name.
pub(super) fn short_path(filename: &str) -> String {
    let path = filename.replace('\\', "/");
    let inside = ["/site-packages/", "/dist-packages/"]
        .iter()
        .filter_map(|d| path.rfind(d).map(|at| at + d.len()))
        .max();
    match inside {
        Some(at) => path.get(at..).unwrap_or("").to_string(),
        None => path.rsplit('/').next().unwrap_or("").to_string(),
    }
}

/// The site of a stack given as frames (innermost first), by the rule of
/// the site grouping: the first Python frame outside torch and the standard
/// library, else the first Python frame.
pub fn site_label(frames: &[Frame]) -> Option<String> {
    let shown = |f: &Frame| format!("{}:{}:{}", short_path(f.filename), f.line, f.name);
    let flags: Vec<u16> = frames
        .iter()
        .map(|f| frame_flags(f.filename, f.name))
        .collect();
    let user = flags
        .iter()
        .position(|fl| *fl & PY != 0 && *fl & (TORCH | STDLIB | GENERATED) == 0);
    match user {
        // The user's frame, and whether it called into compiled code.
        Some(k) => Some(if flags[..k].iter().any(|fl| fl & GENERATED != 0) {
            format!("{} (compiled)", shown(&frames[k]))
        } else {
            shown(&frames[k])
        }),
        None => frames
            .iter()
            .zip(&flags)
            .find(|(_, fl)| **fl & PY != 0)
            .map(|(f, _)| shown(f)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_told_apart_as_the_site_rule_says() {
        let f = |p: &str| frame_flags(p, "f");
        assert_eq!(
            f("/venv/lib/python3.12/site-packages/torch/nn/functional.py") & (PY | TORCH | PACKAGE),
            PY | TORCH | PACKAGE
        );
        assert_eq!(f("/usr/lib/python3.11/threading.py") & STDLIB, STDLIB);
        assert_eq!(f("/usr/lib64/python3/runpy.py") & STDLIB, STDLIB);
        assert_eq!(
            f("/usr/lib/python3.11/site-packages/einops/einops.py") & (STDLIB | PACKAGE),
            PACKAGE
        );
        assert_eq!(f("C:\\Python311\\Lib\\threading.py") & STDLIB, STDLIB);
        assert_eq!(
            f("D:\\x\\.venv\\Lib\\site-packages\\einops\\_backends.py") & (STDLIB | PACKAGE),
            PACKAGE
        );
        assert_eq!(f("/home/me/lib/pythonic/model.py") & STDLIB, 0);
        assert_eq!(f("??") & PY, 0);
        assert_eq!(f("RegisterCUDA_0.cpp") & PY, 0);
        assert_eq!(
            short_path("D:\\x\\.venv\\Lib\\site-packages\\einops\\_backends.py"),
            "einops/_backends.py"
        );
        assert_eq!(short_path("/home/u/proj/model.py"), "model.py");
    }

    #[test]
    fn categories_follow_their_rules_in_order() {
        let c = |path: &str, name: &str| class_of(frame_flags(path, name));
        let sp = "/v/lib/python3.10/site-packages/";
        assert_eq!(
            c(&format!("{sp}torch/optim/adamw.py"), "_single_tensor_adamw"),
            Class::Optimizer
        );
        assert_eq!(c("/home/u/my_optim.py", "step"), Class::Optimizer);
        assert_eq!(
            c(&format!("{sp}torch/_tensor.py"), "backward"),
            Class::Backward
        );
        assert_eq!(
            c(
                "??",
                "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"
            ),
            Class::Backward
        );
        assert_eq!(
            frame_flags("??", "torch::autograd::AccumulateGrad::apply") & ACCUMULATE,
            ACCUMULATE
        );
        assert_eq!(
            c(&format!("{sp}torch/nn/modules/module.py"), "_apply"),
            Class::Parameters
        );
        assert_eq!(c("/home/u/train.py", "load_state_dict"), Class::Parameters);
        assert_eq!(
            c(&format!("{sp}torch/nn/modules/module.py"), "_call_impl"),
            Class::Forward
        );
        assert_eq!(c("/home/u/model.py", "forward"), Class::Forward);
        assert_eq!(c("/home/u/model.py", "to"), Class::Unknown);
        // The first rule that matches wins: an optimizer step inside a forward frame is the optimizer's.
        assert_eq!(
            class_of(
                frame_flags(&format!("{sp}torch/optim/sgd.py"), "step")
                    | frame_flags("/m.py", "forward")
            ),
            Class::Optimizer
        );
        assert_eq!(category(Class::Backward, false, true), Category::Gradients);
        assert_eq!(
            category(Class::Backward, false, false),
            Category::BackwardTemporaries
        );
        assert_eq!(category(Class::Backward, true, false), Category::Gradients);
        assert_eq!(
            category(Class::Optimizer, false, true),
            Category::OptimizerState
        );
        assert_eq!(
            category(Class::Optimizer, false, false),
            Category::OptimizerTemporaries
        );
    }
}
