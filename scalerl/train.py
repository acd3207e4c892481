"""`python -m scalerl.train --use_flash_attn 2 ...`: the source documents' flag-style command (scalerl/cli/flags.py)."""

from scalerl.cli.flags import main

if __name__ == "__main__":
    main()
