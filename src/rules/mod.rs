//! The YAML rule engine and its small expression language.
