// SPDX-License-Identifier: Apache-2.0
//! `insitu demo`: an image with a realistic data set, every function run offloaded and on
//! the host, results compared and data movement tabulated.

use crate::Failure;
use insitu_bench::{generate_dataset, Dataset};
use insitu_host::{Mode, Offloader, Report, Request};
use insitu_image::{human, Fs, Scratch};
use insitu_proto::Value;
use serde_json::json;
use std::path::{Path, PathBuf};

struct Case {
    label: &'static str,
    function: &'static str,
    args: Vec<(String, Value)>,
    paths: Vec<PathBuf>,
    /// Checksums, grep and wc must move at most 1% of the conventional bytes.
    small_result: bool,
}

fn cases(ds: &Dataset) -> Vec<Case> {
    let all = ds.all();
    let text: Vec<PathBuf> = ds.logs.iter().chain(&ds.tables).cloned().collect();
    let s = |k: &str, v: &str| (k.to_string(), Value::Str(v.to_string()));
    let b = |k: &str, v: bool| (k.to_string(), Value::Bool(v));
    let mut out: Vec<Case> = ["crc32c", "xxh3", "sha256", "blake3", "md5"]
        .into_iter()
        .map(|f| Case { label: f, function: f, args: vec![], paths: all.clone(), small_result: true })
        .collect();
    out.push(Case { label: "grep ERROR", function: "grep", args: vec![s("pattern", "ERROR")], paths: ds.logs.clone(), small_result: true });
    out.push(Case {
        label: "grep -c -E",
        function: "grep",
        args: vec![s("pattern", "status=50[23] bytes=9[0-9]{4} "), b("regex", true)],
        paths: ds.logs.clone(),
        small_result: true,
    });
    out.push(Case { label: "wc", function: "wc", args: vec![], paths: text, small_result: true });
    out.push(Case { label: "zstd", function: "zstd", args: vec![], paths: vec![ds.logs[2].clone()], small_result: false });
    let u = |k: &str, v: u64| (k.to_string(), Value::U64(v));
    out.push(Case {
        label: "rs-encode 4+2",
        function: "rs-encode",
        args: vec![u("k", 4), u("m", 2), u("unit", 64 << 10)],
        paths: vec![ds.logs[1].clone()],
        small_result: false,
    });
    out.push(Case { label: "sort", function: "sort", args: vec![], paths: vec![ds.logs[3].clone()], small_result: false });
    out.push(Case { label: "count", function: "count", args: vec![u("min", 1000), u("max", 2_000_000)], paths: ds.arrays.clone(), small_result: true });
    out.push(Case { label: "vector-add", function: "vector-add", args: vec![], paths: ds.arrays.clone(), small_result: false });
    out.push(Case { label: "array-merge", function: "array-merge", args: vec![], paths: ds.arrays.clone(), small_result: false });
    out.push(Case { label: "pagerank", function: "pagerank", args: vec![u("nodes", ds.graph.1)], paths: vec![ds.graph.0.clone()], small_result: false });
    out.push(Case {
        label: "csv-select",
        function: "csv-select",
        args: vec![s("where", "country=DE;amount>=1500;status!=cancelled"), s("columns", "order_id,customer,amount")],
        paths: vec![ds.tables[0].clone()],
        small_result: false,
    });
    // The same selection over a table taken as a piece of a larger object: its first record
    // (the header) comes back as the piece's head.
    out.push(Case {
        label: "csv-select-piece",
        function: "csv-select-piece",
        args: vec![
            s("header", "order_id,customer,country,amount,status,created"),
            s("where", "country=DE;amount>=1500;status!=cancelled"),
            s("columns", "order_id,customer,amount"),
        ],
        paths: vec![ds.tables[0].clone()],
        small_result: false,
    });
    out
}

fn run_case(off: &Offloader, c: &Case, mode: Mode) -> Result<Report, Failure> {
    let req = Request { function: c.function.into(), args: c.args.clone(), paths: c.paths.clone(), output: None, mode, force: true };
    Ok(off.exec(&req)?)
}

/// Compares two reports: same fields per file (output paths aside) and identical result files.
fn agree(a: &Report, b: &Report) -> Result<(), String> {
    if a.results.len() != b.results.len() {
        return Err("different number of results".into());
    }
    for (x, y) in a.results.iter().zip(&b.results) {
        for (k, v) in &x.fields {
            if k == "output" {
                let (p, q) = (Path::new(v.as_str().unwrap_or_default()), y.fields.get(k).and_then(|v| v.as_str()).unwrap_or_default());
                let (pb, qb) = (std::fs::read(p).map_err(|e| e.to_string())?, std::fs::read(q).map_err(|e| e.to_string())?);
                if pb != qb {
                    return Err(format!("{}: result files differ", x.path));
                }
            } else if y.fields.get(k) != Some(v) {
                return Err(format!("{}: {k} is {v} offloaded but {} on the host", x.path, y.fields.get(k).unwrap_or(&json!(null))));
            }
        }
    }
    Ok(())
}

/// Runs the demo; returns exit code 1 if any result disagrees.
pub(crate) fn run(off: &Offloader, size: u64, fs: Fs, dir: Option<PathBuf>, json_out: bool) -> Result<i32, Failure> {
    let scratch = Scratch::new(dir, "demo", size, fs)?;
    let data = scratch.mnt.join("data");
    if !json_out {
        eprintln!("insitu demo: {} {:?} image at {}, generating data...", human(size), fs, scratch.image.display());
    }
    let ds = generate_dataset(&data, size * 55 / 100).map_err(|e| format!("generating the data set: {e}"))?;
    let mut rows = Vec::new();
    let mut all_agree = true;
    for c in cases(&ds) {
        let offload = run_case(off, &c, Mode::Offload)?;
        let host = run_case(off, &c, Mode::Conventional)?;
        let verdict = agree(&offload, &host);
        all_agree &= verdict.is_ok();
        let ratio = offload.stats.bytes_to_host as f64 / host.stats.bytes_to_host.max(1) as f64;
        rows.push(json!({
            "function": c.label,
            "files": c.paths.len(),
            "agree": verdict.is_ok(),
            "disagreement": verdict.err(),
            "offload": offload.stats,
            "conventional": host.stats,
            "bytes_to_host_ratio": ratio,
            "within_1pct": !c.small_result || ratio <= 0.01,
        }));
    }
    let bytes: u64 = ds.all().iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
    let summary = json!({
        "image": {"size": size, "fs": format!("{fs:?}").to_lowercase(), "files": ds.all().len(), "data_bytes": bytes},
        "rows": rows,
        "all_agree": all_agree,
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&summary).unwrap_or_default());
    } else {
        print_table(&summary);
    }
    Ok(if all_agree { 0 } else { 1 })
}

fn print_table(s: &serde_json::Value) {
    println!(
        "{} files, {} of data on a {} {} image\n",
        s["image"]["files"],
        human(s["image"]["data_bytes"].as_u64().unwrap_or(0)),
        human(s["image"]["size"].as_u64().unwrap_or(0)),
        s["image"]["fs"].as_str().unwrap_or("")
    );
    println!(
        "{:<12} {:>5} {:<6} {:>14} {:>14} {:>9} {:>10} {:>10}",
        "function", "files", "agree", "to host:offl.", "to host:conv.", "moved", "offload s", "conv. s"
    );
    for r in s["rows"].as_array().into_iter().flatten() {
        let (o, c) = (&r["offload"], &r["conventional"]);
        println!(
            "{:<12} {:>5} {:<6} {:>14} {:>14} {:>8.3}% {:>10.3} {:>10.3}",
            r["function"].as_str().unwrap_or(""),
            r["files"],
            if r["agree"].as_bool() == Some(true) { "yes" } else { "NO" },
            human(o["bytes_to_host"].as_u64().unwrap_or(0)),
            human(c["bytes_to_host"].as_u64().unwrap_or(0)),
            r["bytes_to_host_ratio"].as_f64().unwrap_or(0.0) * 100.0,
            o["seconds"].as_f64().unwrap_or(0.0),
            c["seconds"].as_f64().unwrap_or(0.0),
        );
        if let Some(d) = r["disagreement"].as_str() {
            println!("    {d}");
        }
    }
    println!("\n{}", if s["all_agree"].as_bool() == Some(true) { "every offloaded result equals the host's" } else { "SOME RESULTS DISAGREE" });
}
