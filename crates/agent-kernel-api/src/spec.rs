//! What a tool says about itself: a [`ToolSpec`] value.

use serde_json::Value;

use crate::{EffectClass, KeyTemplate, Reversibility, Settlement, UndoWindow};

/// What a tool is, as a value: its id, version and description, the JSON Schema of its
/// arguments, and how the kernel must treat its steps (effect, idempotency, settlement,
/// reversibility, undo window), and what a call touches (its resource keys, and for an
/// irreversible tool what makes two calls one payment twice: its duplicate keys).
///
/// Start from [`ToolSpec::read_only`] or [`ToolSpec::mutating`], whose defaults are the safe
/// ones, and change what differs with the `with_…` methods. A tool hands its spec to the
/// registry once, when it is registered; the registry then checks the spec against what the
/// tool can do (see [`ToolEntry`](crate::ToolEntry)).
///
/// ```
/// use agent_kernel_api::{Reversibility, ToolSpec};
/// use serde_json::json;
///
/// let spec = ToolSpec::mutating("shop.pay")
///     .with_description("pays an invoice")
///     .with_schema(json!({"type": "object", "required": ["invoice"]}))
///     .with_reversibility(Reversibility::None);
/// assert_eq!(spec.id(), "shop.pay");
/// assert!(!spec.idempotent());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    id: String,
    version: String,
    description: String,
    args_schema: Value,
    effect: EffectClass,
    idempotent: bool,
    settlement: Settlement,
    reversibility: Reversibility,
    undo_window: Option<UndoWindow>,
    resources: Vec<KeyTemplate>,
    duplicate_keys: Vec<KeyTemplate>,
}

impl ToolSpec {
    /// A read-only tool: idempotent (so retried when it fails in a retriable way), nothing to
    /// settle or undo. Version `"1"`, no description, any JSON object as arguments.
    pub fn read_only(id: impl Into<String>) -> ToolSpec {
        ToolSpec::with_defaults(id.into(), EffectClass::ReadOnly, true)
    }

    /// A mutating tool: not idempotent (never retried), a step whose outcome is unknown is
    /// settled by running its compensation, and that compensation restores everything
    /// ([`Reversibility::Full`]). Version `"1"`, no description, any JSON object as
    /// arguments.
    pub fn mutating(id: impl Into<String>) -> ToolSpec {
        ToolSpec::with_defaults(id.into(), EffectClass::Mutating, false)
    }

    /// [`read_only`](Self::read_only) or [`mutating`](Self::mutating), as `effect` says: for
    /// tools whose effect is read from a file.
    pub fn new(id: impl Into<String>, effect: EffectClass) -> ToolSpec {
        match effect {
            EffectClass::ReadOnly => ToolSpec::read_only(id),
            EffectClass::Mutating => ToolSpec::mutating(id),
        }
    }

    fn with_defaults(id: String, effect: EffectClass, idempotent: bool) -> ToolSpec {
        ToolSpec {
            id,
            version: "1".to_owned(),
            description: String::new(),
            args_schema: serde_json::json!({ "type": "object" }),
            effect,
            idempotent,
            settlement: Settlement::Compensate,
            reversibility: Reversibility::Full,
            undo_window: None,
            resources: Vec::new(),
            duplicate_keys: Vec::new(),
        }
    }

    /// The version recorded with every step, so a log can be replayed against the same
    /// behaviour: change it when the tool's effect or undo data change meaning.
    #[must_use]
    pub fn with_version(mut self, version: impl Into<String>) -> ToolSpec {
        self.version = version.into();
        self
    }

    /// What the tool does, in a sentence, shown by `tools` and to agents over MCP.
    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> ToolSpec {
        self.description = description.into();
        self
    }

    /// The JSON Schema of the tool's arguments; the dispatcher checks every call against it
    /// before the tool sees the arguments.
    #[must_use]
    pub fn with_schema(mut self, args_schema: Value) -> ToolSpec {
        self.args_schema = args_schema;
        self
    }

    /// Whether running the tool twice with the same arguments has the effect of running it
    /// once. Only idempotent tools are ever retried.
    #[must_use]
    pub fn with_idempotent(mut self, idempotent: bool) -> ToolSpec {
        self.idempotent = idempotent;
        self
    }

    /// How a step whose outcome is unknown is settled. [`Settlement::Probe`] is accepted
    /// only from a tool registered with a probe
    /// ([`ToolEntry::compensated_probed`](crate::ToolEntry::compensated_probed) or
    /// [`ToolEntry::probed`](crate::ToolEntry::probed)).
    #[must_use]
    pub fn with_settlement(mut self, settlement: Settlement) -> ToolSpec {
        self.settlement = settlement;
        self
    }

    /// How completely the tool's compensation restores what its effect changed. A mutating
    /// tool without compensation must say [`Reversibility::None`]; each of its steps then
    /// waits for an operator's approval.
    #[must_use]
    pub fn with_reversibility(mut self, reversibility: Reversibility) -> ToolSpec {
        self.reversibility = reversibility;
        self
    }

    /// How long after its saga ended a step may still be undone; `None` (the default) is the
    /// kernel's `[limits] undo_window`.
    #[must_use]
    pub fn with_undo_window(mut self, undo_window: impl Into<Option<UndoWindow>>) -> ToolSpec {
        self.undo_window = undo_window.into();
        self
    }

    /// The resources a call of a mutating tool touches, as keys computed from its arguments
    /// (`$.args.account`, `ledger:$.args.id`): a step claims them with its BEGIN, and no
    /// other saga may claim them until its saga is settled. A mutating tool that declares
    /// none (and whose [`Tool::resources`](crate::Tool::resources) says nothing) touches one
    /// resource named by itself, `tool:ID`; a call whose templates select nothing does too.
    /// Read-only tools claim nothing.
    #[must_use]
    pub fn with_resources(mut self, templates: impl IntoIterator<Item = KeyTemplate>) -> ToolSpec {
        self.resources = templates.into_iter().collect();
        self
    }

    /// What makes two calls of an irreversible tool (reversibility `none` or `partial`) the
    /// same effect, as keys computed from the arguments (`$.args.invoice`): a call whose
    /// keys match a step of the same tool begun within `[limits] duplicate_window` waits
    /// for an operator, whatever its other arguments. Without them, the resources the tool
    /// names decide (never the default `tool:ID`). Declared by a tool of reversibility
    /// `full`, they are refused at registration.
    #[must_use]
    pub fn with_duplicate_keys(
        mut self,
        templates: impl IntoIterator<Item = KeyTemplate>,
    ) -> ToolSpec {
        self.duplicate_keys = templates.into_iter().collect();
        self
    }

    /// The stable tool id used in plans, e.g. `fs.write`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// See [`with_version`](Self::with_version).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// See [`with_description`](Self::with_description); empty when none was given.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// See [`with_schema`](Self::with_schema).
    pub fn args_schema(&self) -> &Value {
        &self.args_schema
    }

    /// Whether the tool changes the world.
    pub fn effect(&self) -> EffectClass {
        self.effect
    }

    /// See [`with_idempotent`](Self::with_idempotent).
    pub fn idempotent(&self) -> bool {
        self.idempotent
    }

    /// See [`with_settlement`](Self::with_settlement).
    pub fn settlement(&self) -> Settlement {
        self.settlement
    }

    /// See [`with_reversibility`](Self::with_reversibility).
    pub fn reversibility(&self) -> Reversibility {
        self.reversibility
    }

    /// See [`with_undo_window`](Self::with_undo_window).
    pub fn undo_window(&self) -> Option<UndoWindow> {
        self.undo_window
    }

    /// See [`with_resources`](Self::with_resources).
    pub fn resources(&self) -> &[KeyTemplate] {
        &self.resources
    }

    /// See [`with_duplicate_keys`](Self::with_duplicate_keys).
    pub fn duplicate_keys(&self) -> &[KeyTemplate] {
        &self.duplicate_keys
    }
}
