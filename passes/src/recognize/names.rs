//! Index names as the user wrote them. Inlining a statement renames the indices it binds itself
//! to `name'N` (private to that inlining); explanations must show `name`, never the suffix.

use egg::Symbol;

/// The source name of an index or tensor symbol (`d'1` is shown as `d`).
pub(crate) fn shown(s: Symbol) -> String {
    let s = s.as_str();
    s.split('\'').next().unwrap_or(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_suffixes_are_hidden() {
        assert_eq!(shown(Symbol::from("d'12")), "d");
        assert_eq!(shown(Symbol::from("j")), "j");
    }
}
