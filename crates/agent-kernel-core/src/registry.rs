//! The tools a kernel can run, by id.

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_kernel_api::DynTool;

use crate::KernelError;

/// Most tools one registry holds.
pub const MAX_TOOLS: usize = 1024;

/// A map from tool id to tool. Ids are unique.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn DynTool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool.
    ///
    /// # Errors
    ///
    /// [`KernelError::DuplicateTool`] when a tool with the same id is already registered,
    /// [`KernelError::TooManyTools`] past [`MAX_TOOLS`].
    pub fn register(&mut self, tool: Arc<dyn DynTool>) -> Result<(), KernelError> {
        let id = tool.id().to_owned();
        if self.tools.contains_key(&id) {
            return Err(KernelError::DuplicateTool(id));
        }
        if self.tools.len() >= MAX_TOOLS {
            return Err(KernelError::TooManyTools(MAX_TOOLS));
        }
        self.tools.insert(id, tool);
        Ok(())
    }

    /// The tool with this id.
    pub fn get(&self, id: &str) -> Option<&Arc<dyn DynTool>> {
        self.tools.get(id)
    }

    /// Every registered id, sorted.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }
}
