//! Byte sizes: parsing user input (`24GiB`, `23.5G`, `80000000000`), reading
//! sizes printed by PyTorch, and formatting them the way PyTorch does.

/// Binary multiplier of a unit label as PyTorch prints it (1.x `KB`/`MB`/`GB`
/// are binary too), or `None` for an unknown label.
pub fn unit_multiplier(unit: &str) -> Option<u64> {
    Some(match unit {
        "B" | "b" | "byte" | "bytes" => 1,
        "KiB" | "KB" | "K" | "k" | "kB" | "Ki" => 1 << 10,
        "MiB" | "MB" | "M" | "Mi" => 1 << 20,
        "GiB" | "GB" | "G" | "Gi" => 1 << 30,
        "TiB" | "TB" | "T" | "Ti" => 1 << 40,
        "PiB" | "PB" | "P" | "Pi" => 1 << 50,
        _ => return None,
    })
}

/// `round(value × unit)` per the CLI contract; `None` when the unit is unknown
/// or the product does not fit in a u64.
pub fn printed_size(value: f64, unit: &str) -> Option<u64> {
    let m = unit_multiplier(unit)?;
    let v = (value * m as f64).round();
    if v.is_finite() && (0.0..1.8446744073709552e19).contains(&v) {
        Some(v as u64)
    } else {
        None
    }
}

/// Parses a SIZE argument: `24GiB`, `24G`, `23.5GiB`, `512MiB`, `80000000000`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid size '{s}': expected a number with an optional unit, e.g. 24GiB, 23.5G or 80000000000"))?;
    let unit = unit.trim();
    let unit = if unit.is_empty() { "B" } else { unit };
    printed_size(value, unit).ok_or_else(|| {
        format!(
            "invalid size '{s}': unknown unit '{unit}' (use B, KiB, MiB, GiB, TiB or K, M, G, T)"
        )
    })
}

/// PyTorch's C++ `format_size` (c10/cuda/CUDACachingAllocator.cpp), used in
/// every allocator message: "1024 bytes", "1.00 KiB", "20.00 MiB", "1.50 GiB".
pub fn format_size(size: u64) -> String {
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1048576 {
        format!("{:.2} KiB", size as f64 / 1024.0)
    } else if size <= 1073741824 {
        format!("{:.2} MiB", size as f64 / 1048576.0)
    } else {
        format!("{:.2} GiB", size as f64 / 1073741824.0)
    }
}

/// A short human size for our own output: "512 B", "1.5 KiB", "20.0 MiB", "79.15 GiB".
pub fn human(size: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = size as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    match i {
        0 => format!("{size} B"),
        _ if v >= 100.0 => format!("{v:.0} {}", UNITS[i]),
        _ => format!("{v:.2} {}", UNITS[i]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_contract_sizes() {
        assert_eq!(parse_size("24GiB").unwrap(), 25769803776);
        assert_eq!(parse_size("24G").unwrap(), 25769803776);
        assert_eq!(parse_size("80000000000").unwrap(), 80000000000);
        assert_eq!(parse_size("23.5GiB").unwrap(), 25232932864);
        assert!(parse_size("24 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn format_size_matches_pytorch_boundaries() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(1048576), "1024.00 KiB");
        assert_eq!(format_size(2097152), "2.00 MiB");
        assert_eq!(format_size(1073741824), "1024.00 MiB");
        assert_eq!(format_size(1073741825), "1.00 GiB");
        assert_eq!(format_size((1u64 << 30) * 800000000), "800000000.00 GiB");
    }

    #[test]
    fn printed_sizes_round() {
        assert_eq!(printed_size(20.0, "MiB"), Some(20971520));
        assert_eq!(printed_size(1.2, "GiB"), Some(1288490189));
        assert_eq!(printed_size(5.0, "parsec"), None);
    }
}
