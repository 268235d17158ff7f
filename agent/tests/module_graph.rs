//! The agent's top-level modules depend on each other without a cycle: each can be read
//! (and changed) knowing only the ones below it. `node` (the composition root and the
//! operator's commands) is the top; nothing else may reach up into it.
//!
//! The check reads the sources: a module depends on another when any of its files names
//! `crate::other` (directly, in a `crate::{…}` list, or through a name `lib.rs` re-exports
//! from it), or reaches the crate root through `super::` (counted by the file's depth;
//! a `mod` block inside a file is not seen, so its `super::` counts one level short).
//! Comments are left out; test code counts like any other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

#[test]
fn the_top_level_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    assert!(graph.len() > 10, "read too few modules: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                let files = &graph[&w[0]][&w[1]];
                format!("{} -> {} (in {:?})", w[0], w[1], files)
            })
            .collect();
        panic!("module cycle:\n  {}", steps.join("\n  "));
    }
}

#[test]
fn the_check_sees_a_cycle_and_every_way_of_naming_a_module() {
    let graph = edges(&[
        ("a", "use crate::b::X;"),
        ("b", "use crate::{c, d::Y};"),
        (
            "c",
            "fn f() -> crate::Reexported { todo!() } // crate::a in a comment",
        ),
        ("d", ""),
        ("e", "use crate::{\n    a::{One, Two},\n};"),
    ]);
    let named = |from: &str| graph[from].keys().cloned().collect::<Vec<_>>();
    assert_eq!(named("a"), ["b"]);
    assert_eq!(named("b"), ["c", "d"]);
    assert_eq!(named("c"), ["e"], "through the re-export, not the comment");
    assert_eq!(named("e"), ["a"]);
    let cycle = find_cycle(&graph).expect("a -> b -> c -> e -> a");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 5, "{cycle:?}");
    let acyclic = edges(&[("a", "use crate::b::X;"), ("b", "use crate::c;"), ("c", "")]);
    assert_eq!(find_cycle(&acyclic), None);
}

#[test]
fn super_paths_count_when_they_climb_to_the_crate_root() {
    assert_eq!(module_depth("drain.rs"), 1);
    assert_eq!(module_depth("node/mod.rs"), 1);
    assert_eq!(module_depth("node/admin.rs"), 2);
    let text = "use super::super::b::X;\nuse super::sibling;\nuse super::super::{c, d::Y};";
    assert_eq!(root_names_through_super(text, 2), ["b", "c", "d"]);
    assert_eq!(root_names_through_super(text, 1), ["sibling"]);
    assert!(root_names_through_super(text, 3).is_empty());
}

/// A graph of modules whose only file is the given text; `Reexported` is `e`'s.
fn edges(modules: &[(&str, &str)]) -> Graph {
    let tops: BTreeSet<String> = modules.iter().map(|(m, _)| m.to_string()).collect();
    let reexports = BTreeMap::from([("Reexported".to_string(), "e".to_string())]);
    let mut graph = Graph::new();
    for (module, text) in modules {
        let deps = graph.entry(module.to_string()).or_default();
        for name in crate_names(&strip_comments(text)) {
            let to = reexports.get(&name).unwrap_or(&name);
            if to != module && tops.contains(to) {
                deps.entry(to.clone())
                    .or_default()
                    .insert(format!("{module}.rs"));
            }
        }
    }
    graph
}

/// Every top-level module of the crate at `src` and the modules its files name.
fn module_graph(src: &Path) -> Graph {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let lib = strip_comments(&lib);
    let tops: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))?;
            Some(rest.trim_end_matches(';').trim().to_string())
        })
        .collect();
    // `pub use module::{A, B};` and `pub use module::A;` in lib.rs.
    let mut reexports = BTreeMap::new();
    for item in lib.split(';') {
        let Some(rest) = item.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        for name in names.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if !name.is_empty() {
                reexports.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    let mut graph = Graph::new();
    for top in &tops {
        let mut files = Vec::new();
        let file = src.join(format!("{top}.rs"));
        if file.exists() {
            files.push(file);
        }
        rust_files(&src.join(top), &mut files);
        let deps = graph.entry(top.clone()).or_default();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source file");
            let shown = file
                .strip_prefix(src)
                .unwrap_or(&file)
                .display()
                .to_string();
            for name in crate_names(&strip_comments(&text)) {
                let to = reexports.get(&name).unwrap_or(&name);
                if to != top && tops.contains(to) {
                    deps.entry(to.clone()).or_default().insert(shown.clone());
                }
            }
        }
    }
    graph
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text without `//` comments (doc comments included).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How deep in the crate the module of the file at `path` (relative to `src`) is: 1 for
/// `x.rs` and `x/mod.rs`, 2 for `x/y.rs`, and so on.
fn module_depth(path: &str) -> usize {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.last() {
        Some(&"mod.rs") => parts.len() - 1,
        _ => parts.len(),
    }
}

/// The names reached through `super::` paths that climb to the crate root from a module
/// `depth` levels down.
fn root_names_through_super(text: &str, depth: usize) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in text.match_indices("super::") {
        // Only the first `super::` of a run.
        if text[..at].ends_with("super::") {
            continue;
        }
        let mut after = &text[at..];
        let mut ups = 0;
        while let Some(next) = after.strip_prefix("super::") {
            ups += 1;
            after = next;
        }
        if ups == depth {
            // The path ends with its statement (a `use` list may span lines).
            let path = after.split(';').next().unwrap_or(after);
            names.extend(crate_names(&format!("crate::{path}")));
        }
    }
    names
}

/// The first name after each `crate::`, and each first name in a `crate::{…}` list.
fn crate_names(text: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        let Some(list) = rest.strip_prefix('{') else {
            names.push(ident(rest));
            continue;
        };
        // Items at the list's own depth, split at its commas.
        let (mut depth, mut item_start) = (0usize, 0usize);
        for (i, c) in list.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    names.push(ident(&list[item_start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    names.push(ident(&list[item_start..i]));
                    item_start = i + 1;
                }
                _ => {}
            }
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// A cycle as the modules along it, the first repeated at the end; `None` if there is none.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        graph: &Graph,
        at: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(at) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = path.iter().position(|m| m == at).unwrap_or(0);
                let mut cycle = path[from..].to_vec();
                cycle.push(at.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(at.to_string(), Mark::Open);
        path.push(at.to_string());
        for next in graph.get(at).into_iter().flat_map(|d| d.keys()) {
            if let Some(cycle) = visit(graph, next, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(at.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for start in graph.keys() {
        if let Some(cycle) = visit(graph, start, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}
