use crate::types::Dim;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexExpr {
    pub terms: Vec<(String, i64)>,
    pub constant: i64,
    pub div: Option<Dim>,
}
