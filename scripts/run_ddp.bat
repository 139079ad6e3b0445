@echo off
rem Launch scripts\train_ddp.py on N processes:  scripts\run_ddp.bat 2 --epochs 3
if "%~1"=="" (
  echo usage: scripts\run_ddp.bat N [train_ddp.py flags...] 1>&2
  exit /b 2
)
set N=%1
shift
set ARGS=
:collect
if "%~1"=="" goto run
set ARGS=%ARGS% %1
shift
goto collect
:run
cd /d "%~dp0.."
rem Windows has no NCCL: torchrun uses gloo here (the script picks it).
python -m torch.distributed.run --standalone --nproc_per_node=%N% scripts\train_ddp.py %ARGS%
exit /b %ERRORLEVEL%
