"""xmlm-untrained: save the update-0 checkpoint of a fairseq-train command line (the papers' "untrained" rows).

    xmlm-untrained --save-dir DIR <the same arguments as fairseq-train>

writes DIR/checkpoint_untrained.pt: the randomly initialised model exactly as fairseq-train would start it
(same seed, same task flags), in fairseq's checkpoint format so every evaluation tool reads it.
"""
import os
import sys

from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

from fairseq_xmlm.errors import cli_errors


@cli_errors
def main(argv=None):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv if argv is not None else sys.argv[1:])
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    os.makedirs(cfg.checkpoint.save_dir, exist_ok=True)
    path = os.path.join(cfg.checkpoint.save_dir, "checkpoint_untrained.pt")
    trainer.consolidate_optimizer()  # fairseq-train does this before every save
    trainer.save_checkpoint(path, {"train_iterator": {"epoch": 1}, "val_loss": None})
    print(path)


if __name__ == "__main__":
    main()
