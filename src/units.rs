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

/// Parses a size: `24GiB`, `24G`, `24gb`, `23.5GiB`, `512MiB`, `80000000000`.
/// Units are binary whatever their case or spelling, as PyTorch prints them
/// (`GB` is 2^30, see [`decimal_unit_note`]); a result past 2^64 - 1 is named
/// as an overflow.
pub fn parse_size(s: &str) -> Result<u64, String> {
    sized(s)?.ok_or_else(|| overflow(s))
}

/// [`parse_size`], with `None` for a size past 2^64 - 1 (each caller names its limit).
fn sized(s: &str) -> Result<Option<u64>, String> {
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
    let multiplier = match unit.to_ascii_lowercase().as_str() {
        "" | "b" | "byte" | "bytes" => 1,
        "k" | "kb" | "ki" | "kib" => 1 << 10,
        "m" | "mb" | "mi" | "mib" => 1 << 20,
        "g" | "gb" | "gi" | "gib" => 1 << 30,
        "t" | "tb" | "ti" | "tib" => 1 << 40,
        "p" | "pb" | "pi" | "pib" => 1 << 50,
        _ => {
            return Err(format!(
                "invalid size '{s}': unknown unit '{unit}' (use B, KiB, MiB, GiB, TiB or K, M, G, T)"
            ));
        }
    };
    // Whole byte counts stay exact (an f64 holds integers only to 2^53).
    if num.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(num
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(multiplier)));
    }
    let v = (value * multiplier as f64).round();
    Ok((v.is_finite() && v < 1.8446744073709552e19).then_some(v as u64))
}

fn overflow(s: &str) -> String {
    format!(
        "invalid size '{s}': overflows 64 bits (the largest size is 18446744073709551615 bytes, 16 EiB)"
    )
}

/// The largest device size accepted: no card comes near 1 PiB.
pub const MAX_DEVICE_SIZE: u64 = 1 << 50;

/// Parses a device size (`--capacity`): [`parse_size`], refusing 0 and sizes
/// over 1 PiB with the reason.
pub fn parse_device_size(s: &str) -> Result<u64, String> {
    match sized(s)? {
        Some(0) => Err(format!(
            "invalid size '{s}': a device of 0 bytes holds nothing"
        )),
        Some(n) if n <= MAX_DEVICE_SIZE => Ok(n),
        // Past 2^64 is past 1 PiB: the limit that applies is the device's.
        n => Err(format!(
            "invalid size '{s}': {}over 1 PiB, more than any GPU holds (a unit typo?)",
            n.map_or(String::new(), |n| format!("{} is ", human(n)))
        )),
    }
}

/// A one-line note for a size written with a decimal-looking unit (`24GB`,
/// `512mb`): read as binary, as PyTorch prints sizes; `None` for the rest.
pub fn decimal_unit_note(s: &str) -> Option<String> {
    let t = s.trim();
    let unit = t.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '_');
    let letter = match unit.trim().to_ascii_lowercase().as_str() {
        "kb" => "Ki",
        "mb" => "Mi",
        "gb" => "Gi",
        "tb" => "Ti",
        "pb" => "Pi",
        _ => return None,
    };
    let bytes = parse_size(t).ok()?;
    Some(format!(
        "note: '{t}' is read as binary ({letter}B, {bytes} bytes), as PyTorch prints sizes; give a byte count for a decimal size"
    ))
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
    fn units_in_any_case_overflow_named_device_sizes_bounded() {
        for s in ["24gb", "24g", "24GB", "24Gb", "24gib", "24 GiB"] {
            assert_eq!(parse_size(s), Ok(25769803776), "{s}");
        }
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        for s in [
            "18446744073709551616",
            "18446744073709551615K",
            "16384PiB",
            "1e30",
        ] {
            let e = parse_size(s).unwrap_err();
            assert!(
                e.contains("overflows 64 bits") || e.contains("unknown unit"),
                "{s}: {e}"
            );
        }
        assert!(
            parse_size("18446744073709551616")
                .unwrap_err()
                .contains("overflows 64 bits")
        );
        assert!(
            parse_size("16384PiB")
                .unwrap_err()
                .contains("overflows 64 bits")
        );
        assert!(
            parse_size("99999999999999999999.5G")
                .unwrap_err()
                .contains("overflows 64 bits")
        );
        assert_eq!(parse_size("0"), Ok(0));
        assert!(
            parse_device_size("0")
                .unwrap_err()
                .contains("0 bytes holds nothing")
        );
        assert!(parse_device_size("0GiB").is_err());
        assert_eq!(parse_device_size("1PiB"), Ok(1 << 50));
        let e = parse_device_size("1025TiB").unwrap_err();
        assert!(e.contains("over 1 PiB"), "{e}");
        assert_eq!(parse_device_size("80GiB"), Ok(80 << 30));
    }

    #[test]
    fn decimal_units_get_one_note() {
        assert_eq!(
            decimal_unit_note("24GB").as_deref(),
            Some(
                "note: '24GB' is read as binary (GiB, 25769803776 bytes), as PyTorch prints sizes; give a byte count for a decimal size"
            )
        );
        assert!(decimal_unit_note("512mb").is_some());
        for s in ["24GiB", "24G", "24g", "80000000000", "1.5TiB"] {
            assert_eq!(decimal_unit_note(s), None, "{s}");
        }
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
