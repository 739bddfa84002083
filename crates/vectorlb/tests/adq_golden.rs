//! `vectorlb adq plan` against golden outputs (tests/golden/adq/NAME.toml -> NAME.plan): the
//! commands follow what Intel's adqsetup runs for the same configuration. Set
//! VECTORLB_UPDATE_GOLDEN=1 to rewrite the .plan files after a deliberate change, then review
//! the diff.

use std::path::Path;

#[test]
fn plans_match_golden_outputs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/adq");
    let update = std::env::var_os("VECTORLB_UPDATE_GOLDEN").is_some();
    let mut n = 0;
    let mut names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "toml")).collect();
    names.sort();
    for cfg in names {
        let plan = vectorlb::adq::render(&vectorlb::adq::load(&cfg).unwrap());
        let golden = cfg.with_extension("plan");
        if update {
            std::fs::write(&golden, &plan).unwrap();
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_else(|e| panic!("{}: {e} (run with VECTORLB_UPDATE_GOLDEN=1)", golden.display()));
        assert_eq!(plan, want, "{}", cfg.display());
        n += 1;
    }
    assert!(n >= 2, "golden configurations found: {n}");
}
