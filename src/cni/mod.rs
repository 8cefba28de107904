//! The CNI protocol edge: environment, configuration, versions, results and errors.

pub mod config;
pub mod env;
pub mod error;
pub mod version;

pub use error::CniError;
