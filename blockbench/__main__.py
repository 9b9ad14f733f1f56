from .cli import main

if __name__ == "__main__":  # not when multiprocessing's spawn or forkserver imports it in a child
    raise SystemExit(main())
