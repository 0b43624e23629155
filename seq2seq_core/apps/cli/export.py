"""`s2s export RUN_DIR --to FORMAT --output DIR`: write the model `s2s generate RUN_DIR` uses for
CTranslate2, Hugging Face or safetensors, then say how to load it."""

from __future__ import annotations

from ..summary import export_lines
from .shared import registry_of


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "export",
        parents=[common],
        help="write a trained model for CTranslate2, Hugging Face or safetensors",
        description="Export the model `s2s generate RUN_DIR` uses: the checkpoint "
        "RUN_DIR/result.json names (the one `s2s train` tested), else checkpoint_average.pt, "
        "else the newest checkpoint. The folder gets s2s_export.json, which lets --force "
        "replace it later.",
    )
    s.add_argument("run_dir", help="a run directory of `s2s train`")
    s.add_argument("--to", required=True, choices=["ctranslate2", "huggingface", "safetensors"])
    s.add_argument("--output", required=True, help="the folder to write")
    s.add_argument(
        "--quantization", help="ctranslate2 only: int8, int8_float32, int16, float16, bfloat16, ..."
    )
    s.add_argument(
        "--force",
        action="store_true",
        help="replace an --output that holds a previous export "
        "(s2s_export.json) and nothing else; any other non-empty folder is refused",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...inference.formats import ExportJob, export

    job = ExportJob(args.run_dir, args.to, args.output, args.quantization, args.force)
    out = export(job, registry_of(args))
    print("\n".join(export_lines(args.run_dir, args.to, out)))
    return 0
