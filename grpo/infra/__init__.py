"""Infrastructure: processes that die with the trainer, torchrun worlds and collectives, checkpoint files, the run log, run folders and process set-up."""
