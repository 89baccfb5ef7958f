#!/usr/bin/env bash
# Renders allocdoc's HTML report for a synthetic training trace and takes a
# screenshot of it in headless Chromium (Debian's `chromium` package).
#
#   scripts/screenshot.sh [--events N] [--html OUT.html] [--png OUT.png] [--trace-only] [--measure]
#   scripts/screenshot.sh --top SNAPSHOT [--html OUT.html] [--png OUT.png] [--measure]
#
# --top renders `allocdoc top SNAPSHOT --report` (what fills the card) instead
# of the replay; with --measure it also prints what Chromium laid out: the
# chart's category layers, its peak/OOM markers and the tables beside it.
#
# --measure also prints the report's size and how long Chromium takes to load
# and lay it out (performance.now() around an iframe, logged to the console),
# best of three. $ALLOCDOC names the binary to use (default: cargo build --release).
#
# The trace is a variable-length training loop (16 weights, then per step 24
# layers of activations whose size follows the batch's sequence length, a
# temporary per layer, and the backward pass freeing them in reverse), the
# workload where the default allocator fragments and expandable segments do
# not. It is generated here, deterministically (Park–Miller LCG), so the
# screenshot and the 1 M-event measurement use the same workload at any size.
set -euo pipefail
cd "$(dirname "$0")/.."

events=3000
html=""
png=docs/report.png
trace_only=0
measure=0
top=""
while [ $# -gt 0 ]; do
  case "$1" in
    --events) events="$2"; shift 2 ;;
    --html) html="$2"; shift 2 ;;
    --png) png="$2"; shift 2 ;;
    --trace-only) trace_only=1; shift ;;
    --measure) measure=1; shift ;;
    --top) top="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trace="$work/varlen_training.csv"

# --top renders a snapshot: no trace to make.
[ -z "$top" ] && awk -v N="$events" 'BEGIN {
  x = 7
  print "# synthetic variable-length training trace (scripts/screenshot.sh)"
  print "action,id,size,stream"
  MiB = 1048576; n = 0
  for (w = 0; w < 16; w++) { x = (x * 16807) % 2147483647; printf "alloc,w%d,%d,0\n", w, (64 + x % 192) * MiB; n++ }
  for (s = 0; n < N; s++) {
    x = (x * 16807) % 2147483647
    seq = 512 + (x % 9) * 256
    for (l = 0; l < 24 && n < N; l++) {
      a = seq * 32768 + l * 4096
      printf "alloc,a%d,%d,0\n", l, a
      printf "alloc,t,%d,0\n", 2 * a + 512
      printf "free,t,,0\n"
      n += 3
    }
    for (l = 23; l >= 0 && n < N; l--) {
      printf "alloc,g,%d,0\n", seq * 32768 + 1024
      printf "free,a%d,,0\n", l
      printf "free,g,,0\n"
      n += 3
    }
  }
}' > "$trace"

if [ "$trace_only" = 1 ]; then
  cat "$trace"
  exit 0
fi

[ -n "$html" ] || html="$work/report.html"
if [ -z "${ALLOCDOC:-}" ]; then
  cargo build --release --quiet
  ALLOCDOC=./target/release/allocdoc
fi
ALLOCDOC=$(realpath "$ALLOCDOC")
html=$(realpath -m "$html")
start=$(date +%s.%N)
if [ -n "$top" ]; then
  "$ALLOCDOC" top "$top" --report "$html" >/dev/null
else
# PyTorch's defaults, then expandable segments, overlaid (run from the trace's
# folder so the report names it plainly). Exit 1 (the last config still runs
# out) still writes the report.
(cd "$work" && "$ALLOCDOC" replay "$(basename "$trace")" --conf "" --conf expandable_segments:True \
  --capacity "${CAPACITY:-5.25GiB}" --report "$html" >/dev/null) || [ $? -eq 1 ]
fi
end=$(date +%s.%N)
test -s "$html"

if ! command -v chromium >/dev/null; then
  echo "chromium not found (apt-get install -y chromium); report left at $html" >&2
  exit 3
fi
chrome() {
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$(mktemp -d -p "$work")" "$@"
}
mkdir -p "$(dirname "$png")"
chrome --hide-scrollbars --screenshot="$png" --window-size=1400,1800 \
  "file://$(realpath "$html")" 2>/dev/null
echo "$png"

if [ "$measure" = 1 ]; then
  cat > "$work/measure.html" <<'HTML'
<!DOCTYPE html><html><body><script>
const t0 = performance.now();
const f = document.createElement('iframe');
f.style.width = '1400px';
f.style.height = '1800px';
f.onload = function () {
  f.contentDocument.body.getBoundingClientRect();
  console.log('REPORT_LAYOUT_MS ' + (performance.now() - t0).toFixed(1));
};
f.src = location.hash.slice(1);
document.body.appendChild(f);
</script></body></html>
HTML
  best=""
  for _ in 1 2 3; do
    ms=$(chrome --allow-file-access-from-files --enable-logging=stderr --log-level=0 \
      --timeout=10000 --dump-dom "file://$work/measure.html#file://$(realpath "$html")" \
      2>&1 >/dev/null | grep -oE 'REPORT_LAYOUT_MS [0-9.]+' | cut -d' ' -f2 || true)
    [ -n "$ms" ] || continue
    if [ -z "$best" ] || awk -v a="$ms" -v b="$best" 'BEGIN{exit !(a<b)}'; then best=$ms; fi
  done
  if [ -n "$top" ]; then
    # What the browser built from the page (its DOM after parsing, not our text).
    dom=$(chrome --dump-dom "file://$(realpath "$html")" 2>/dev/null)
    printf 'snapshot %s\nchart_layers %s\nmarkers %s\ntables %s\ntable_rows %s\n' "$top" \
      "$(grep -o '<polygon class="layer"' <<<"$dom" | wc -l)" \
      "$(grep -oE 'class="oom-label"[^>]*>[^<]*' <<<"$dom" | sed 's/.*>//' | paste -sd ';' -)" \
      "$(grep -o '<table' <<<"$dom" | wc -l)" "$(grep -o '<tr' <<<"$dom" | wc -l)"
  fi
  [ -n "$top" ] || printf 'events %s\n' "$events"
  printf 'report_bytes %s\nallocdoc_seconds %.2f\nchromium_load_layout_ms %s\n' \
    "$(wc -c < "$html")" "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" "${best:-n/a}"
fi
