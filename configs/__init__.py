"""Experiment configs (`python train.py --config=configs/<file>.py[:args]`); `presets` holds what they share."""
