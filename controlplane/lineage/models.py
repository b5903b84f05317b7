"""The lineage index: a mirror of each application's commit graph in the store.

The store is the truth; these rows can be rebuilt from it at any time (`manage.py reindex`).
Besides the manifest fields queries need, every snapshot carries two derived numbers that
make history queries cheap at millions of snapshots:

* `generation`: 1 for a root, else 1 + the largest generation of its parents, so every
  parent has a smaller generation than its children;
* a place on a *chain*: the graph is cut into first-parent paths. A snapshot extends its
  first parent's chain when that parent is still the chain's tip, and starts a new chain
  otherwise (fork, rollback, root). Inside a chain generations strictly increase.

`ChainEdge` rows connect chains: one first-parent edge from each chain's root to the snapshot
it grew from, and one edge per merge parent. The history of any snapshot is then a handful
of (chain, generation <= g) ranges, found by a short walk over chain edges; see
docs/lineage.md.
"""

from __future__ import annotations

from django.db import models

from controlplane.applications.models import Application
from controlplane.patterns import WholeRegexValidator

SNAPSHOT_ID_PATTERN = r"^[0-9a-f]{64}$"
COMMIT_KINDS = ("initial", "epoch", "rescale", "rollback", "fork", "migration", "savepoint")


class Chain(models.Model):
    """A first-parent path of snapshots; `tip_generation` tells whether a child may extend it."""

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="+")
    root_generation = models.PositiveBigIntegerField()
    tip_generation = models.PositiveBigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(tip_generation__gte=models.F("root_generation")),
                name="chain_tip_not_below_root",
            ),
        ]

    def __str__(self) -> str:
        return f"chain {self.pk} (generations {self.root_generation}..{self.tip_generation})"


class Snapshot(models.Model):
    """One indexed manifest. `snapshot_id` is the store's 64-hex manifest id."""

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="+")
    snapshot_id = models.CharField(
        max_length=64, validators=[WholeRegexValidator(SNAPSHOT_ID_PATTERN)]
    )
    branch = models.CharField(max_length=255)
    epoch = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=16, choices=[(k, k) for k in COMMIT_KINDS])
    parallelism = models.PositiveIntegerField()
    max_parallelism = models.PositiveIntegerField()
    code_version = models.CharField(max_length=255, blank=True)
    config_hash = models.CharField(max_length=255, blank=True)
    operation_id = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField()
    offsets = models.JSONField(default=dict)
    stats = models.JSONField(default=dict)
    provenance = models.JSONField(default=dict)
    # The manifest's parent ids in order (also in SnapshotParent); read with every log row.
    parent_ids = models.JSONField(default=list)
    parent_count = models.PositiveSmallIntegerField(default=0)
    # What the manifest says of each sink of the run that committed it (`sink_facts`, from
    # `extra.sinks` and the lag in `stats`): {name: {"role": chain|log|two_phase, "held": e}}.
    sinks = models.JSONField(default=dict, blank=True)
    # Inside an application the index is derived data: removing a row removes what was
    # derived from it (its descendants), so every link within the graph cascades.
    first_parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    generation = models.PositiveBigIntegerField()
    chain = models.ForeignKey(Chain, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["application", "snapshot_id"], name="snapshot_unique_per_application"
            ),
            models.UniqueConstraint(fields=["chain", "generation"], name="snapshot_chain_place"),
            models.CheckConstraint(
                condition=models.Q(generation__gte=1), name="snapshot_generation_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(parallelism__gte=1)
                & models.Q(parallelism__lte=models.F("max_parallelism")),
                name="snapshot_parallelism_within_m",
            ),
            models.CheckConstraint(
                condition=models.Q(first_parent__isnull=True, parent_count=0)
                | models.Q(first_parent__isnull=False, parent_count__gte=1),
                name="snapshot_first_parent_iff_parents",
            ),
        ]
        indexes = [
            # Graph page: newest indexed snapshots of an application.
            models.Index(fields=["application", "-id"], name="snapshot_app_recent"),
            models.Index(fields=["application", "branch", "-generation"], name="snapshot_branch"),
        ]

    def __str__(self) -> str:
        return f"{self.snapshot_id[:12]} ({self.branch} epoch {self.epoch})"


class SnapshotParent(models.Model):
    """Parent `position` (0 = first parent) of `child`; merges have several."""

    child = models.ForeignKey(Snapshot, on_delete=models.CASCADE, related_name="parent_links")
    parent = models.ForeignKey(Snapshot, on_delete=models.CASCADE, related_name="child_links")
    position = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["child", "position"]
        constraints = [
            models.UniqueConstraint(fields=["child", "position"], name="parent_position_unique"),
            models.UniqueConstraint(fields=["child", "parent"], name="parent_listed_once"),
        ]

    def __str__(self) -> str:
        return f"{self.child_id} -> {self.parent_id} (#{self.position})"


class ChainEdge(models.Model):
    """From snapshot (from_chain, from_generation) to its parent (to_chain, to_generation).

    Stored for every chain root with a first parent (`first_parent=True`) and for every merge
    parent; first parents inside a chain are implied by the chain itself.
    """

    from_chain = models.ForeignKey(Chain, on_delete=models.CASCADE, related_name="+")
    from_generation = models.PositiveBigIntegerField()
    to_chain = models.ForeignKey(Chain, on_delete=models.CASCADE, related_name="+")
    to_generation = models.PositiveBigIntegerField()
    first_parent = models.BooleanField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(to_generation__lt=models.F("from_generation")),
                name="chain_edge_goes_back_in_generation",
            ),
        ]
        indexes = [
            models.Index(
                fields=["from_chain", "from_generation", "to_chain", "to_generation"],
                name="chain_edge_walk",
            ),
        ]

    def __str__(self) -> str:
        return (
            f"chain {self.from_chain_id}@{self.from_generation} -> "
            f"chain {self.to_chain_id}@{self.to_generation}"
        )


class Branch(models.Model):
    """A branch ref as last indexed; `head` is None once the branch was deleted in the store."""

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=255)
    head = models.ForeignKey(
        Snapshot, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reflog_seq = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["application", "name"]
        verbose_name_plural = "branches"
        constraints = [
            models.UniqueConstraint(fields=["application", "name"], name="branch_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class Tag(models.Model):
    """A tag ref (savepoints, automatic rollback tags); `target` None once deleted."""

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=255)
    target = models.ForeignKey(
        Snapshot, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reflog_seq = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["application", "name"]
        constraints = [
            models.UniqueConstraint(fields=["application", "name"], name="tag_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class ReflogEntry(models.Model):
    """Move number `seq` of ref `ref` (``heads/x`` or ``tags/y``): old -> new, and why."""

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="+")
    ref = models.CharField(max_length=255)
    seq = models.PositiveBigIntegerField()
    # Plain ids ("" = the ref did not exist), not foreign keys: gc may collect what an old
    # reflog entry names.
    old_id = models.CharField(max_length=64, blank=True, default="")
    new_id = models.CharField(max_length=64, blank=True, default="")
    operation_id = models.CharField(max_length=255, blank=True, default="")
    reason = models.TextField(blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["application", "ref", "-seq"]
        verbose_name_plural = "reflog entries"
        constraints = [
            models.UniqueConstraint(fields=["application", "ref", "seq"], name="reflog_unique"),
            models.CheckConstraint(condition=models.Q(seq__gte=1), name="reflog_seq_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.ref}@{{{self.seq}}}"
