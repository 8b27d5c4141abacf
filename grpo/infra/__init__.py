"""Infrastructure: processes that die with the trainer, torchrun worlds and collectives, checkpoint files, the run log, run folders, process set-up and the stop flag of SIGINT/SIGTERM."""
