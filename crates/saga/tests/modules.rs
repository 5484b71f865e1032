//! The library's modules depend on each other one way only: a reader can learn them
//! bottom up, and a change to one never needs the ones above it. This reads each
//! module's `crate::…` paths from its source (outside comments and its unit tests) and
//! fails naming the first cycle it finds.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn the_library_modules_depend_one_way_with_no_cycle() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 10, "too few modules read: {:?}", graph.keys());
    assert!(
        graph["handler"].contains("transaction"),
        "a known dependency was not read: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the library's modules depend on each other in a cycle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn a_cycle_is_found_and_named() {
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .fold(Graph::new(), |mut graph, (from, to)| {
            graph.entry(from.into()).or_default().insert(to.into());
            graph.entry(to.into()).or_default();
            graph
        });
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
}

/// Each module of `src` (a file, `lib.rs` aside, with its submodules' files) to the
/// modules it names.
fn module_graph(src: &Path) -> Graph {
    let modules: BTreeSet<String> = fs::read_dir(src)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .filter(|name| name != "lib")
        .collect();
    let reexports = reexports(&fs::read_to_string(src.join("lib.rs")).unwrap());
    modules
        .iter()
        .map(|module| {
            let code = sources_of(src, module)
                .iter()
                .map(|source| code_of(source))
                .collect::<Vec<_>>()
                .join("\n");
            let deps = crate_paths(&code)
                .into_iter()
                .filter_map(|name| {
                    if modules.contains(&name) {
                        Some(name)
                    } else {
                        reexports.get(&name).cloned()
                    }
                })
                .filter(|dep| dep != module)
                .collect();
            (module.clone(), deps)
        })
        .collect()
}

/// The source of `module`: its file, and the files of its submodules in `src/<module>/`,
/// whose dependencies are the module's own.
fn sources_of(src: &Path, module: &str) -> Vec<String> {
    let mut sources = vec![fs::read_to_string(src.join(format!("{module}.rs"))).unwrap()];
    if let Ok(entries) = fs::read_dir(src.join(module)) {
        let mut paths: Vec<_> = entries
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
            .collect();
        paths.sort();
        sources.extend(paths.iter().map(|path| fs::read_to_string(path).unwrap()));
    }
    sources
}

/// The source without comments and without its unit tests: a doc link is not a
/// dependency, and a test may reach anywhere.
fn code_of(source: &str) -> String {
    let source = source.split("#[cfg(test)]").next().unwrap();
    source
        .lines()
        .map(|line| line.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first name after each `crate::`, and each name in a `crate::{…}` group.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for rest in code.split("crate::").skip(1) {
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(group.split(',').filter_map(first_identifier));
        } else {
            names.extend(first_identifier(rest));
        }
    }
    names
}

fn first_identifier(text: &str) -> Option<String> {
    let name: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// `pub use module::{A, B};` in `lib.rs`: each name to its module, so that
/// `crate::A` counts as a use of `module`.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for statement in code_of(lib).split(';') {
        let Some(path) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = path.split_once("::") else {
            continue;
        };
        for name in names.trim_matches(|c| c == '{' || c == '}').split(',') {
            if let Some(name) = first_identifier(name) {
                map.insert(name, module.trim().to_owned());
            }
        }
    }
    map
}

/// A path that comes back to where it started, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|seen| seen == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut Vec::new(), &mut done))
}
