//! The tool traits ([`Tool`], [`Compensate`], [`Probe`]) and [`ToolEntry`], which makes a
//! tool of any of them a registry's trait object ([`DynTool`]).

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

use crate::resource::bounded_keys;
use crate::{
    BoxFuture, EffectClass, ProbeOutcome, Reversibility, Settlement, ToolContext, ToolError,
    ToolOutput, ToolSpec, Undo, UndoWindow, template_keys, tool_resource,
};

/// A tool: a [`ToolSpec`] that describes it, and [`execute`](Self::execute), which performs
/// its effect.
///
/// That is all a read-only tool, or a tool whose effect cannot be taken back, implements. A
/// tool that can undo its effect also implements [`Compensate`]; a tool that can tell
/// whether an effect of unknown outcome happened implements [`Probe`]. A tool is registered
/// through a [`ToolEntry`] that says which of these it implements, and the registry refuses
/// a spec that claims what the tool cannot do: a mutating tool without [`Compensate`] must
/// declare [`Reversibility::None`] (then every step waits for an operator's approval), and
/// only a tool with [`Probe`] may declare [`Settlement::Probe`].
///
/// # Contract
///
/// - [`check`](Self::check) and [`simulate`](Self::simulate) change nothing.
/// - `execute` must not block the async runtime: blocking I/O belongs on a blocking thread
///   (`tokio::task::spawn_blocking`), or goes through the context's file access
///   ([`ToolContext::write_file`] and its siblings), which runs on one.
/// - `execute` reports whether its effect may have happened when it fails
///   ([`ToolError::uncertain`], [`ToolError::not_applied`]): a wrong "not applied" makes a
///   rollback skip an effect that happened.
///
/// # Misuse
///
/// Writing a file with `std::fs` in `execute` blocks a runtime thread and escapes the
/// kernel's sandbox; use [`ToolContext::write_file`]. Declaring
/// [`Reversibility::Full`] for a mutating tool registered with [`ToolEntry::new`] is refused
/// at registration.
pub trait Tool: Send + Sync + 'static {
    /// What the tool is; read once, when the tool is registered.
    fn spec(&self) -> ToolSpec;

    /// Performs the effect.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] that says whether the effect may have happened.
    fn execute(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send;

    /// Checks what the spec's schema cannot say (a policy's ruling on a path, say), without
    /// side effects. The dispatcher has already checked the arguments against the schema;
    /// the default accepts whatever the schema accepts.
    ///
    /// # Errors
    ///
    /// [`ToolError::invalid_args`] when the arguments are malformed, [`ToolError::denied`]
    /// when the sandbox policy forbids the call.
    fn check(&self, _args: &Value) -> Result<(), ToolError> {
        Ok(())
    }

    /// The resources a call with `args` touches, when the tool names them itself (a file
    /// tool names the file as its sandbox resolves it, however the path was spelled).
    /// `Ok(None)`, the default, leaves them to the spec's
    /// [`with_resources`](ToolSpec::with_resources) templates, and without those to the
    /// tool's own name (`tool:ID`); `Ok(Some(vec![]))` says the call touches nothing another
    /// saga could. Asked before anything of the call runs, for mutating tools only; it must
    /// not change anything.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the arguments name no resource it can resolve; the step is then
    /// refused before it began.
    fn resources(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
    ) -> impl Future<Output = Result<Option<Vec<String>>, ToolError>> + Send {
        std::future::ready(Ok(None))
    }

    /// What `execute` would plausibly return, computed without touching anything: used by
    /// dry runs. The default describes the call.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the call could not succeed even in simulation.
    fn simulate(
        &self,
        ctx: &ToolContext,
        _args: &Value,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send {
        let output = ToolOutput::new(serde_json::json!({ "dry_run": true }))
            .with_effect(format!("would run {}", ctx.tool_id));
        std::future::ready(Ok(output))
    }
}

/// A tool that can undo its effect.
///
/// A call goes through three phases, and the saga engine logs between them:
///
/// 1. [`prepare`](Self::prepare) captures what compensation will need (a file's previous
///    bytes, say) without changing anything. The engine writes it to the log with the step's
///    BEGIN record, durably, *before* the effect.
/// 2. [`Tool::execute`] performs the effect.
/// 3. [`compensate`](Self::compensate), on rollback, undoes it from the logged [`Undo`]
///    alone.
///
/// # Contract
///
/// - `prepare`, `changed_since` and `changed_since_prepared` change nothing.
/// - `compensate` must be safe when the effect happened, when it did not, and when it is
///   unknown whether it did: a crash can land between the effect and its log record, and
///   then `output` is `None`. It must be idempotent (recovery may run it twice) and must not
///   panic or block the runtime.
pub trait Compensate: Tool {
    /// Undoes the effect of `execute` using what `prepare` captured.
    ///
    /// `output` is `None` when the step's outcome was never recorded (the process died between
    /// BEGIN and COMMIT, or `execute` failed with an uncertain outcome).
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the world could not be restored; the saga then ends in
    /// `FailedRollbackPartial`.
    fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> impl Future<Output = Result<(), ToolError>> + Send;

    /// Captures what compensation needs, without changing anything. The default captures
    /// nothing ([`Undo::none`]): compensation then works from the arguments and, once the
    /// step committed, its output.
    ///
    /// # Errors
    ///
    /// Any [`ToolError`]; the step then fails before its effect.
    fn prepare(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
    ) -> impl Future<Output = Result<Undo, ToolError>> + Send {
        std::future::ready(Ok(Undo::none()))
    }

    /// Whether what a step left has changed since (another saga, a person or another program
    /// touched it), so that compensating it now would destroy someone else's work:
    /// `Ok(Some(what))` names the change; `Ok(None)` says nothing changed, or that the tool
    /// cannot tell (the default).
    ///
    /// The kernel asks before every compensation (a failing saga's own rollback, a live
    /// abort, `rollback`, `recover`, a dead letter's retry, `undo`); a changed step is not
    /// compensated but left as a dead letter whose error starts `changed since:`, until an
    /// operator forces it (`dlq retry --force`, `undo --force`).
    ///
    /// `undo` and `output` are the step's record. The step's outcome may be unknown, and its
    /// compensation may already have run once without its outcome being recorded: so the
    /// answer is `None` both when what the step left is there and when what its compensation
    /// restores is. It must not change anything.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the check could not be made: the compensation is then not run
    /// either (a dead letter), and `undo` refuses the step.
    fn changed_since(
        &self,
        _ctx: &ToolContext,
        _args: &Value,
        _undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> impl Future<Output = Result<Option<String>, ToolError>> + Send {
        std::future::ready(Ok(None))
    }

    /// Whether the world is still what [`prepare`](Self::prepare) found: asked once the
    /// step holds its resources, before its effect. Another saga may have written a
    /// resource and settled between the step's preparation and its claim; compensating
    /// the step with `undo` would then destroy that saga's write, so the step must not run
    /// (`Some(why)`; nothing of it is applied). `None` when the world is as prepared, or
    /// the tool cannot tell.
    ///
    /// Unlike [`changed_since`](Self::changed_since), which must accept what the step
    /// itself leaves (its outcome may be unknown), the effect has not happened here: a
    /// world that already holds what the step would leave has changed since the
    /// preparation, and compensating would put back what `prepare` found over another
    /// writer's identical result. The default asks `changed_since`, which cannot tell that
    /// apart; a tool whose effect can leave exactly what another writer left (a file
    /// written with the same bytes, an append of the same text) should answer this itself.
    /// It must not change anything.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the check could not be made. The engine then treats the world
    /// as unchanged, as it does for a tool that cannot tell, and the step runs.
    fn changed_since_prepared(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> impl Future<Output = Result<Option<String>, ToolError>> + Send {
        self.changed_since(ctx, args, undo, None)
    }

    /// What compensating a step would put back, in a sentence for an operator
    /// (`undo --preview`: "puts back the previous 12 bytes of `ws/a.txt`"), read from the
    /// step's record alone without touching anything. `None`, the default, when the tool
    /// cannot say.
    fn restores(
        &self,
        _args: &Value,
        _undo: &Undo,
        _output: Option<&ToolOutput>,
    ) -> Option<String> {
        None
    }
}

/// A tool that can tell whether the effect of a step whose outcome is unknown happened: the
/// only kind that may declare [`Settlement::Probe`].
pub trait Probe: Tool {
    /// Whether the effect happened, without changing anything. `undo` is what `prepare`
    /// captured ([`Undo::none`] for a tool without [`Compensate`]).
    ///
    /// # Errors
    ///
    /// A [`ToolError`] when the probe itself failed; the outcome then stays unknown.
    fn probe(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> impl Future<Output = Result<ProbeOutcome, ToolError>> + Send;
}

/// A shared tool is a tool: register a clone of an `Arc` and keep the other to look at the
/// tool's state.
impl<T: Tool> Tool for Arc<T> {
    fn spec(&self) -> ToolSpec {
        T::spec(self)
    }

    fn execute(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send {
        T::execute(self, ctx, args)
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        T::check(self, args)
    }

    fn resources(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> impl Future<Output = Result<Option<Vec<String>>, ToolError>> + Send {
        T::resources(self, ctx, args)
    }

    fn simulate(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send {
        T::simulate(self, ctx, args)
    }
}

impl<T: Compensate> Compensate for Arc<T> {
    fn compensate(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> impl Future<Output = Result<(), ToolError>> + Send {
        T::compensate(self, ctx, args, undo, output)
    }

    fn prepare(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> impl Future<Output = Result<Undo, ToolError>> + Send {
        T::prepare(self, ctx, args)
    }

    fn changed_since(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
        output: Option<&ToolOutput>,
    ) -> impl Future<Output = Result<Option<String>, ToolError>> + Send {
        T::changed_since(self, ctx, args, undo, output)
    }

    fn changed_since_prepared(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> impl Future<Output = Result<Option<String>, ToolError>> + Send {
        T::changed_since_prepared(self, ctx, args, undo)
    }

    fn restores(&self, args: &Value, undo: &Undo, output: Option<&ToolOutput>) -> Option<String> {
        T::restores(self, args, undo, output)
    }
}

impl<T: Probe> Probe for Arc<T> {
    fn probe(
        &self,
        ctx: &ToolContext,
        args: &Value,
        undo: &Undo,
    ) -> impl Future<Output = Result<ProbeOutcome, ToolError>> + Send {
        T::probe(self, ctx, args, undo)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// The object-safe form of a registered tool, for registries of `Arc<dyn DynTool>`: its
/// spec, whether it compensates and probes, and every phase as a boxed future.
///
/// Only [`ToolEntry`] makes one; implement [`Tool`] (and [`Compensate`], [`Probe`]).
pub trait DynTool: sealed::Sealed + Send + Sync + 'static {
    /// What the tool declared.
    fn spec(&self) -> &ToolSpec;
    /// Whether the tool implements [`Compensate`].
    fn compensates(&self) -> bool;
    /// Whether the tool implements [`Probe`].
    fn probes(&self) -> bool;
    /// See [`Tool::check`].
    ///
    /// # Errors
    ///
    /// As [`Tool::check`].
    fn check(&self, args: &Value) -> Result<(), ToolError>;
    /// The resources a call with `args` claims with its BEGIN, sorted and without repeats:
    /// none for a read-only tool; else [`Tool::resources`], or the spec's templates, or
    /// `tool:ID` when neither names any.
    ///
    /// # Errors
    ///
    /// As [`Tool::resources`]; [`ToolError::invalid_args`] for more than
    /// [`MAX_RESOURCES_PER_STEP`](crate::MAX_RESOURCES_PER_STEP) keys, one longer than
    /// [`MAX_RESOURCE_KEY_BYTES`](crate::MAX_RESOURCE_KEY_BYTES), or one containing U+0000.
    fn resources<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Vec<String>, ToolError>>;
    /// The keys that make a call with `args` the same effect as an earlier step of the tool:
    /// none for a tool of reversibility `full`; else the spec's
    /// [`with_duplicate_keys`](ToolSpec::with_duplicate_keys) templates, or without those the
    /// resources the tool names ([`Tool::resources`], its spec's templates), never the
    /// default `tool:ID`.
    ///
    /// # Errors
    ///
    /// As [`resources`](Self::resources).
    fn duplicate_keys<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Vec<String>, ToolError>>;
    /// See [`Compensate::prepare`]; for a tool without compensation, its
    /// [`check`](Tool::check), then [`Undo::none`].
    fn prepare<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Undo, ToolError>>;
    /// See [`Tool::execute`].
    fn execute<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
    /// See [`Tool::simulate`].
    fn simulate<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
    /// See [`Probe::probe`]; [`ProbeOutcome::Unknown`] for a tool without one.
    fn probe<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
    ) -> BoxFuture<'a, Result<ProbeOutcome, ToolError>>;
    /// See [`Compensate::changed_since`]; `None` for a tool without compensation.
    fn changed_since<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
        output: Option<&'a ToolOutput>,
    ) -> BoxFuture<'a, Result<Option<String>, ToolError>>;
    /// See [`Compensate::changed_since_prepared`]; `None` for a tool without compensation.
    fn changed_since_prepared<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
    ) -> BoxFuture<'a, Result<Option<String>, ToolError>>;
    /// See [`Compensate::restores`]; `None` for a tool without compensation.
    fn restores(&self, args: &Value, undo: &Undo, output: Option<&ToolOutput>) -> Option<String>;
    /// See [`Compensate::compensate`]. A read-only tool has nothing to undo (`Ok`); a
    /// mutating tool without compensation fails, saying so.
    fn compensate<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
        output: Option<&'a ToolOutput>,
    ) -> BoxFuture<'a, Result<(), ToolError>>;

    /// The spec's id.
    fn id(&self) -> &str {
        self.spec().id()
    }
    /// The spec's version.
    fn version(&self) -> &str {
        self.spec().version()
    }
    /// The spec's effect.
    fn effect(&self) -> EffectClass {
        self.spec().effect()
    }
    /// The spec's idempotency.
    fn idempotent(&self) -> bool {
        self.spec().idempotent()
    }
    /// The spec's settlement.
    fn settlement(&self) -> Settlement {
        self.spec().settlement()
    }
    /// The spec's argument schema.
    fn args_schema(&self) -> &Value {
        self.spec().args_schema()
    }
    /// The spec's description.
    fn description(&self) -> &str {
        self.spec().description()
    }
    /// The spec's reversibility.
    fn reversibility(&self) -> Reversibility {
        self.spec().reversibility()
    }
    /// The spec's undo window.
    fn undo_window(&self) -> Option<UndoWindow> {
        self.spec().undo_window()
    }
}

type PrepareFn<T> =
    for<'a> fn(&'a T, &'a ToolContext, &'a Value) -> BoxFuture<'a, Result<Undo, ToolError>>;
type ChangedFn<T> = for<'a> fn(
    &'a T,
    &'a ToolContext,
    &'a Value,
    &'a Undo,
    Option<&'a ToolOutput>,
) -> BoxFuture<'a, Result<Option<String>, ToolError>>;
type CompensateFn<T> = for<'a> fn(
    &'a T,
    &'a ToolContext,
    &'a Value,
    &'a Undo,
    Option<&'a ToolOutput>,
) -> BoxFuture<'a, Result<(), ToolError>>;
type ProbeFn<T> = for<'a> fn(
    &'a T,
    &'a ToolContext,
    &'a Value,
    &'a Undo,
) -> BoxFuture<'a, Result<ProbeOutcome, ToolError>>;

type PreparedChangedFn<T> = for<'a> fn(
    &'a T,
    &'a ToolContext,
    &'a Value,
    &'a Undo,
) -> BoxFuture<'a, Result<Option<String>, ToolError>>;

type RestoresFn<T> = fn(&T, &Value, &Undo, Option<&ToolOutput>) -> Option<String>;

/// What a [`Compensate`] tool adds, as function pointers.
struct Compensation<T> {
    prepare: PrepareFn<T>,
    changed_since: ChangedFn<T>,
    changed_since_prepared: PreparedChangedFn<T>,
    compensate: CompensateFn<T>,
    restores: RestoresFn<T>,
}

impl<T: Compensate> Compensation<T> {
    fn of() -> Self {
        Compensation {
            prepare: |tool, ctx, args| Box::pin(tool.prepare(ctx, args)),
            changed_since: |tool, ctx, args, undo, output| {
                Box::pin(tool.changed_since(ctx, args, undo, output))
            },
            changed_since_prepared: |tool, ctx, args, undo| {
                Box::pin(tool.changed_since_prepared(ctx, args, undo))
            },
            compensate: |tool, ctx, args, undo, output| {
                Box::pin(tool.compensate(ctx, args, undo, output))
            },
            restores: |tool, args, undo, output| tool.restores(args, undo, output),
        }
    }
}

fn probe_of<T: Probe>() -> ProbeFn<T> {
    |tool, ctx, args, undo| Box::pin(tool.probe(ctx, args, undo))
}

/// A tool with its spec, read once, and the abilities it was registered with.
struct Registered<T> {
    spec: ToolSpec,
    tool: T,
    compensation: Option<Compensation<T>>,
    probe: Option<ProbeFn<T>>,
}

impl<T> sealed::Sealed for Registered<T> {}

impl<T: Tool> Registered<T> {
    /// The resources the tool names for a call: its own [`Tool::resources`] (an empty list
    /// included: the call touches nothing another saga could), else the keys its spec's
    /// templates select; `None` when neither names any.
    async fn declared_resources(
        &self,
        ctx: &ToolContext,
        args: &Value,
    ) -> Result<Option<Vec<String>>, ToolError> {
        if let Some(keys) = self.tool.resources(ctx, args).await? {
            return Ok(Some(keys));
        }
        let keys = template_keys(self.spec.resources(), args);
        Ok((!keys.is_empty()).then_some(keys))
    }
}

impl<T: Tool> DynTool for Registered<T> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn compensates(&self) -> bool {
        self.compensation.is_some()
    }

    fn probes(&self) -> bool {
        self.probe.is_some()
    }

    fn check(&self, args: &Value) -> Result<(), ToolError> {
        self.tool.check(args)
    }

    fn resources<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Vec<String>, ToolError>> {
        Box::pin(async move {
            if self.spec.effect() == EffectClass::ReadOnly {
                return Ok(Vec::new());
            }
            match self.declared_resources(ctx, args).await? {
                Some(keys) => bounded_keys(keys),
                None => Ok(vec![tool_resource(self.spec.id())]),
            }
        })
    }

    fn duplicate_keys<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Vec<String>, ToolError>> {
        Box::pin(async move {
            if self.spec.effect() == EffectClass::ReadOnly
                || self.spec.reversibility() == Reversibility::Full
            {
                return Ok(Vec::new());
            }
            // Else the resources the tool names: never the coarse `tool:ID`, which would
            // make every call of the tool a duplicate of the one before.
            let keys = if self.spec.duplicate_keys().is_empty() {
                self.declared_resources(ctx, args)
                    .await?
                    .unwrap_or_default()
            } else {
                template_keys(self.spec.duplicate_keys(), args)
            };
            bounded_keys(keys)
        })
    }

    fn prepare<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<Undo, ToolError>> {
        match &self.compensation {
            Some(compensation) => (compensation.prepare)(&self.tool, ctx, args),
            // Nothing to capture; the check rules again where the step is prepared (a plan
            // resumed in another process, say), so a denied step never begins.
            None => Box::pin(std::future::ready(
                self.tool.check(args).map(|()| Undo::none()),
            )),
        }
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(self.tool.execute(ctx, args))
    }

    fn simulate<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(self.tool.simulate(ctx, args))
    }

    fn probe<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
    ) -> BoxFuture<'a, Result<ProbeOutcome, ToolError>> {
        match self.probe {
            Some(probe) => probe(&self.tool, ctx, args, undo),
            None => Box::pin(std::future::ready(Ok(ProbeOutcome::Unknown))),
        }
    }

    fn changed_since<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
        output: Option<&'a ToolOutput>,
    ) -> BoxFuture<'a, Result<Option<String>, ToolError>> {
        match &self.compensation {
            Some(compensation) => (compensation.changed_since)(&self.tool, ctx, args, undo, output),
            None => Box::pin(std::future::ready(Ok(None))),
        }
    }

    fn changed_since_prepared<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
    ) -> BoxFuture<'a, Result<Option<String>, ToolError>> {
        match &self.compensation {
            Some(compensation) => {
                (compensation.changed_since_prepared)(&self.tool, ctx, args, undo)
            }
            None => Box::pin(std::future::ready(Ok(None))),
        }
    }

    fn restores(&self, args: &Value, undo: &Undo, output: Option<&ToolOutput>) -> Option<String> {
        let compensation = self.compensation.as_ref()?;
        (compensation.restores)(&self.tool, args, undo, output)
    }

    fn compensate<'a>(
        &'a self,
        ctx: &'a ToolContext,
        args: &'a Value,
        undo: &'a Undo,
        output: Option<&'a ToolOutput>,
    ) -> BoxFuture<'a, Result<(), ToolError>> {
        if let Some(compensation) = &self.compensation {
            return (compensation.compensate)(&self.tool, ctx, args, undo, output);
        }
        let result = match self.spec.effect() {
            EffectClass::ReadOnly => Ok(()),
            _ => Err(ToolError::failed(format!(
                "`{}` is mutating but implements no compensation",
                self.spec.id()
            ))),
        };
        Box::pin(std::future::ready(result))
    }
}

/// A tool ready for a registry, with what it can do: compensate, probe, both or neither.
///
/// The registry (a dispatcher, or the front door's `KernelBuilder`) checks the tool's spec
/// against these abilities when it is registered: a mutating tool without compensation must
/// declare [`Reversibility::None`], and only a tool with a probe may declare
/// [`Settlement::Probe`].
///
/// ```
/// use agent_kernel_api::{Tool, ToolContext, ToolEntry, ToolError, ToolOutput, ToolSpec};
/// use serde_json::Value;
///
/// /// A tool that only echoes its arguments.
/// struct Echo;
///
/// impl Tool for Echo {
///     fn spec(&self) -> ToolSpec {
///         ToolSpec::read_only("echo")
///     }
///     async fn execute(&self, _ctx: &ToolContext, args: &Value) -> Result<ToolOutput, ToolError> {
///         Ok(ToolOutput::new(args.clone()))
///     }
/// }
///
/// let entry = ToolEntry::new(Echo);
/// assert_eq!(entry.id(), "echo");
/// assert!(!entry.as_dyn().compensates());
/// ```
#[derive(Clone)]
pub struct ToolEntry(Arc<dyn DynTool>);

impl std::fmt::Debug for ToolEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolEntry")
            .field("spec", self.0.spec())
            .field("compensates", &self.0.compensates())
            .field("probes", &self.0.probes())
            .finish()
    }
}

impl ToolEntry {
    /// A tool that neither compensates nor probes: a read-only tool, or a mutating one whose
    /// spec declares [`Reversibility::None`].
    pub fn new<T: Tool>(tool: T) -> ToolEntry {
        ToolEntry::registered(tool, None, None)
    }

    /// A tool that can undo its effect.
    pub fn compensated<T: Compensate>(tool: T) -> ToolEntry {
        ToolEntry::registered(tool, Some(Compensation::of()), None)
    }

    /// A tool that can tell whether an effect happened, without compensation (its spec
    /// declares [`Reversibility::None`]).
    pub fn probed<T: Probe>(tool: T) -> ToolEntry {
        ToolEntry::registered(tool, None, Some(probe_of()))
    }

    /// A tool that can undo its effect and tell whether it happened.
    pub fn compensated_probed<T: Compensate + Probe>(tool: T) -> ToolEntry {
        ToolEntry::registered(tool, Some(Compensation::of()), Some(probe_of()))
    }

    fn registered<T: Tool>(
        tool: T,
        compensation: Option<Compensation<T>>,
        probe: Option<ProbeFn<T>>,
    ) -> ToolEntry {
        ToolEntry(Arc::new(Registered {
            spec: tool.spec(),
            tool,
            compensation,
            probe,
        }))
    }

    /// The tool's id.
    pub fn id(&self) -> &str {
        self.0.id()
    }

    /// The registered tool, as a registry holds it.
    pub fn as_dyn(&self) -> &Arc<dyn DynTool> {
        &self.0
    }

    /// The registered tool, as a registry holds it.
    pub fn into_dyn(self) -> Arc<dyn DynTool> {
        self.0
    }

    /// What is wrong with the tool's declaration, if anything: what a registry refuses it
    /// for.
    pub fn misdeclaration(&self) -> Option<Misdeclaration> {
        misdeclaration(self.0.as_ref())
    }
}

/// A spec that claims what its tool cannot do; see [`ToolEntry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Misdeclaration {
    /// A mutating tool without compensation that does not declare [`Reversibility::None`].
    ReversibleWithoutCompensation,
    /// [`Settlement::Probe`] declared by a tool without a probe.
    ProbeWithoutProbe,
    /// An empty id.
    EmptyId,
    /// Duplicate keys declared by a tool of reversibility `full`, whose calls are undone,
    /// not repeated.
    DuplicateKeysWhenReversible,
}

impl std::fmt::Display for Misdeclaration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Misdeclaration::ReversibleWithoutCompensation => {
                "a mutating tool without compensation must declare reversibility none"
            }
            Misdeclaration::ProbeWithoutProbe => "settlement probe needs a tool with a probe",
            Misdeclaration::EmptyId => "a tool id is not empty",
            Misdeclaration::DuplicateKeysWhenReversible => {
                "duplicate keys are for tools of reversibility none or partial"
            }
        })
    }
}

fn misdeclaration(tool: &dyn DynTool) -> Option<Misdeclaration> {
    let spec = tool.spec();
    if spec.id().is_empty() {
        return Some(Misdeclaration::EmptyId);
    }
    if spec.effect() == EffectClass::Mutating
        && !tool.compensates()
        && spec.reversibility() != Reversibility::None
    {
        return Some(Misdeclaration::ReversibleWithoutCompensation);
    }
    if spec.settlement() == Settlement::Probe && !tool.probes() {
        return Some(Misdeclaration::ProbeWithoutProbe);
    }
    if !spec.duplicate_keys().is_empty() && spec.reversibility() == Reversibility::Full {
        return Some(Misdeclaration::DuplicateKeysWhenReversible);
    }
    None
}
