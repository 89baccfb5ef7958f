//! The rule files shipped in the binary. `every_rule_file_is_embedded` fails when a
//! file in rules/ is missing here.

pub(super) const FILES: &[(&str, &str)] = &[
    (
        "rules/alloc-retries.yaml",
        include_str!("../../rules/alloc-retries.yaml"),
    ),
    (
        "rules/async-capacity.yaml",
        include_str!("../../rules/async-capacity.yaml"),
    ),
    (
        "rules/cached-free-segments.yaml",
        include_str!("../../rules/cached-free-segments.yaml"),
    ),
    (
        "rules/capacity.yaml",
        include_str!("../../rules/capacity.yaml"),
    ),
    (
        "rules/cuda-malloc-async.yaml",
        include_str!("../../rules/cuda-malloc-async.yaml"),
    ),
    (
        "rules/expandable-already-on.yaml",
        include_str!("../../rules/expandable-already-on.yaml"),
    ),
    (
        "rules/free-exceeds-request.yaml",
        include_str!("../../rules/free-exceeds-request.yaml"),
    ),
    (
        "rules/free-plus-cached.yaml",
        include_str!("../../rules/free-plus-cached.yaml"),
    ),
    (
        "rules/gc-threshold-with-fraction.yaml",
        include_str!("../../rules/gc-threshold-with-fraction.yaml"),
    ),
    (
        "rules/huge-request.yaml",
        include_str!("../../rules/huge-request.yaml"),
    ),
    (
        "rules/inactive-split-high.yaml",
        include_str!("../../rules/inactive-split-high.yaml"),
    ),
    (
        "rules/inactive-split-rising.yaml",
        include_str!("../../rules/inactive-split-rising.yaml"),
    ),
    (
        "rules/memory-fraction-cap.yaml",
        include_str!("../../rules/memory-fraction-cap.yaml"),
    ),
    (
        "rules/memory-outside-pytorch.yaml",
        include_str!("../../rules/memory-outside-pytorch.yaml"),
    ),
    (
        "rules/non-allocator-host.yaml",
        include_str!("../../rules/non-allocator-host.yaml"),
    ),
    (
        "rules/non-allocator-library.yaml",
        include_str!("../../rules/non-allocator-library.yaml"),
    ),
    (
        "rules/non-allocator-nccl.yaml",
        include_str!("../../rules/non-allocator-nccl.yaml"),
    ),
    (
        "rules/non-allocator-runtime.yaml",
        include_str!("../../rules/non-allocator-runtime.yaml"),
    ),
    (
        "rules/non-pytorch-in-process.yaml",
        include_str!("../../rules/non-pytorch-in-process.yaml"),
    ),
    (
        "rules/other-processes.yaml",
        include_str!("../../rules/other-processes.yaml"),
    ),
    (
        "rules/oversize-segments.yaml",
        include_str!("../../rules/oversize-segments.yaml"),
    ),
    (
        "rules/private-pools.yaml",
        include_str!("../../rules/private-pools.yaml"),
    ),
    (
        "rules/request-exceeds-capacity.yaml",
        include_str!("../../rules/request-exceeds-capacity.yaml"),
    ),
    (
        "rules/request-over-1eb.yaml",
        include_str!("../../rules/request-over-1eb.yaml"),
    ),
    (
        "rules/reserved-gap.yaml",
        include_str!("../../rules/reserved-gap.yaml"),
    ),
    (
        "rules/segment-size-20mib.yaml",
        include_str!("../../rules/segment-size-20mib.yaml"),
    ),
    (
        "rules/segment-size-2mib.yaml",
        include_str!("../../rules/segment-size-2mib.yaml"),
    ),
    (
        "rules/shared-memory-spill.yaml",
        include_str!("../../rules/shared-memory-spill.yaml"),
    ),
    (
        "rules/small-pool-fragmentation.yaml",
        include_str!("../../rules/small-pool-fragmentation.yaml"),
    ),
    (
        "rules/use-expandable-segments.yaml",
        include_str!("../../rules/use-expandable-segments.yaml"),
    ),
    (
        "rules/use-max-split-size.yaml",
        include_str!("../../rules/use-max-split-size.yaml"),
    ),
];

#[cfg(test)]
mod tests {
    #[test]
    fn every_rule_file_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/rules");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.ends_with(".yaml").then(|| format!("rules/{name}"))
            })
            .collect();
        on_disk.sort();
        let embedded: Vec<String> = super::FILES.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(embedded, on_disk);
    }
}
