//! Builds the web chat app into the edge: every file of
//! `clients/web/dist/app` (made by `npm run build` there) becomes a
//! static the edge can serve. Without a bundle the edge has no built-in
//! app (it can still serve a `web_root` directory).

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo");
    let dir = Path::new(&manifest).join("../clients/web/dist/app");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x != "map"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut out = String::from("pub static FILES: &[(&str, &[u8])] = &[\n");
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 name");
        let abs = path.canonicalize().expect("listed file");
        writeln!(
            out,
            "    ({name:?}, include_bytes!({:?})),",
            abs.display().to_string()
        )
        .expect("string");
    }
    out.push_str("];\n");
    let target = Path::new(&std::env::var("OUT_DIR").expect("set by cargo")).join("web_app.rs");
    std::fs::write(target, out).expect("OUT_DIR is writable");
}
