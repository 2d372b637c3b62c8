; Inno Setup script for Hearth on Windows (x64). UNTESTED HERE: written for issue 7, never compiled or run —
; see packaging/README.md ("Windows") for the steps and what to check first.
;
; Build the bundle on Windows first (PowerShell, from the repository root):
;   py -3.11 -m venv build\venv-cpu
;   build\venv-cpu\Scripts\pip install -r packaging\requirements-cpu.txt
;   build\venv-cpu\Scripts\python packaging\stage_model.py build\model-cpu --weights int4
;   build\venv-cpu\Scripts\python packaging\render_icons.py build\icons     (then make packaging\windows\hearth.ico
;                                                                             from build\icons, e.g. with ImageMagick)
;   build\venv-cpu\Scripts\pyinstaller --noconfirm --distpath dist\pyinstaller --workpath build\pyinstaller-cpu packaging\hearth.spec
;   robocopy build\model-cpu dist\pyinstaller\hearth\_internal\model /E
; then compile this script:  iscc packaging\windows\hearth.iss   →  dist\hearth-0.1.0-windows-x64-setup.exe

#define AppName "Hearth"
#define AppVersion "0.1.0"
#define Bundle "..\..\dist\pyinstaller\hearth"

[Setup]
AppId={{6C1E8A53-2F0B-4B8E-9E5D-4A7F1C2D9B61}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=Hearth
DefaultDirName={autopf}\Hearth
DefaultGroupName=Hearth
; per-user install by default (no admin prompt); the dialog offers all users
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename=hearth-{#AppVersion}-windows-x64-setup
SetupIconFile=hearth.ico
UninstallDisplayIcon={app}\hearth.exe
Compression=lzma2/ultra64
SolidCompression=yes
LZMAUseSeparateProcess=yes
WizardStyle=modern

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked
Name: "addtopath"; Description: "Add hearth-cli to PATH"; Flags: unchecked

[Files]
; the whole one-folder build, model included (read-only at run time; user data goes to %LOCALAPPDATA%\hearth)
Source: "{#Bundle}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\Hearth"; Filename: "{app}\hearth.exe"
Name: "{group}\Uninstall Hearth"; Filename: "{uninstallexe}"
Name: "{autodesktop}\Hearth"; Filename: "{app}\hearth.exe"; Tasks: desktopicon

[Registry]
Root: HKCU; Subkey: "Environment"; ValueType: expandsz; ValueName: "Path"; ValueData: "{olddata};{app}"; \
  Tasks: addtopath; Check: NeedsAddPath(ExpandConstant('{app}'))

[Run]
; the installed build checks itself (window, one chat turn, saved context) in a throwaway data dir
Filename: "{app}\hearth.exe"; Parameters: "--self-test"; Description: "Run Hearth's self-test"; \
  Flags: postinstall skipifsilent unchecked runhidden waituntilterminated
Filename: "{app}\hearth.exe"; Description: "{cm:LaunchProgram,Hearth}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; nothing: Hearth writes nothing under {app}; conversations in %LOCALAPPDATA%\hearth are the user's and stay

[Code]
function NeedsAddPath(Dir: string): Boolean;
var
  Current: string;
begin
  if not RegQueryStringValue(HKEY_CURRENT_USER, 'Environment', 'Path', Current) then
  begin
    Result := True;
    exit;
  end;
  Result := Pos(';' + Uppercase(Dir) + ';', ';' + Uppercase(Current) + ';') = 0;
end;
