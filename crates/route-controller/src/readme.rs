//! Test support: the tables of the operator docs (`docs/operating.md`),
//! which tests check against the code (the Warning reasons, the metrics).

/// The rows of the docs/operating.md table whose header row is `header`, each as its
/// trimmed cells.
pub(crate) fn table(header: &str) -> Vec<Vec<String>> {
    let readme = include_str!("../../../docs/operating.md");
    let start = readme
        .find(header)
        .unwrap_or_else(|| panic!("docs/operating.md has no table headed {header:?}"));
    readme[start..]
        .lines()
        .map(str::trim_start)
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}
