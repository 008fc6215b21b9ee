//! Shared resources of a run (typed spec sections, and what later gets built from them), looked
//! up by type.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

/// A map from type to one shared value of that type.
#[derive(Default, Clone)]
pub struct Resources(HashMap<TypeId, Arc<dyn Any + Send + Sync>>);

impl Resources {
    /// An empty map.
    pub fn new() -> Self {
        Resources::default()
    }

    /// Adds `value`, replacing any earlier value of the same type.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: Arc<T>) {
        self.0.insert(TypeId::of::<T>(), value);
    }

    /// The value of type `T`, if present.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.0.get(&TypeId::of::<T>()).and_then(|value| value.clone().downcast::<T>().ok())
    }
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Resources({} entries)", self.0.len())
    }
}
