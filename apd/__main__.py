import sys

try:
    from apd.cli import main
except KeyboardInterrupt:  # Ctrl-C while torch and the rest are still being imported: nothing was started
    print("apd: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
